from ._errors import Error as Error
from ._errors import InputError as InputError
from ._errors import PeerError as PeerError
from ._errors import Timeout as Timeout
from ._native import DEFAULT_MAX_IN_FLIGHT as DEFAULT_MAX_IN_FLIGHT
from ._native import KEY_VERSION as KEY_VERSION
from ._native import URL_VERSION as URL_VERSION
from ._native import Memory as Memory
from ._native import Notification as Notification
from ._native import Pending as Pending
from ._native import Probe as Probe
from ._native import RemoteBuffer as RemoteBuffer
from ._native import Transport as Transport
from ._native import View as View

def probe() -> list[Probe]: ...
def supported() -> bool: ...
