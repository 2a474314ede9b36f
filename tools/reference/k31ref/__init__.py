"""k31ref: plain-PyTorch reference of the K3.1 text model (see tools/reference/README.md)."""
from .config import TextConfig, load_config, parse_config  # noqa: F401
from .model import Cache, Model  # noqa: F401
