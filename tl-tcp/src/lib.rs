//! TCP transport (issue: transports that work everywhere). Not built yet.
