"""The Slurm backend: placements handed to an existing Slurm cluster."""

from .backend import SlurmBackend

__all__ = ["SlurmBackend"]
