"""The SSH backend: nodes reached over asyncssh, jobs run under the node agent."""

from .backend import SshBackend
from .config import Forward, NodeConfig, RemoteResult

__all__ = ["Forward", "NodeConfig", "RemoteResult", "SshBackend"]
