//! PCIe topology from sysfs: which NICs are nearest a piece of memory.
