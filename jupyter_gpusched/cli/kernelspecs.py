"""``jupyter gpusched kernelspec add|list``: a lab's own GPU kernels in the launcher.

``add`` installs a kernelspec whose kernels run on leased GPUs (``--gpus 2 --gpu-mem 40G --model
A100 --name a100x2``), as ``jupyter kernelspec install`` would (system-wide by default,
``--user``, ``--sys-prefix`` or ``--prefix``); ``list`` shows the GPU kernelspecs installed
and what each asks for. Remove one with ``jupyter kernelspec remove NAME``.
"""

from __future__ import annotations

import re
import sys

from traitlets import Bool, Unicode

from .base import GpuSchedCommand, UsageError, option_aliases, option_trait

_NAME = re.compile(r"^[a-z0-9._-]+$", re.IGNORECASE)  # what jupyter_client accepts


class KernelspecApp(GpuSchedCommand):
    """``kernelspec add --name NAME [--gpus N --gpu-mem 40G --model A100 ...]`` or ``list``."""

    command = "kernelspec"
    description = "Install a GPU kernelspec (add) or show the installed ones (list)."
    examples = "jupyter gpusched kernelspec add --gpus 2 --gpu-mem 40G --model A100 --name a100x2"

    kernel_name = Unicode("", help="Name of the kernelspec (letters, digits, . _ -).").tag(
        config=True
    )
    display_name = Unicode(
        "", help="Name in the launcher; default: 'Python 3 (<what it asks for>)'."
    ).tag(config=True)
    gpus = option_trait("--gpus")
    gpu_mem = option_trait("--gpu-mem")
    share = option_trait("--share")
    model = option_trait("--model")
    cpus = option_trait("--cpus")
    mem = option_trait("--mem")
    host_mem = option_trait("--host-mem")
    max_runtime = option_trait("--max-runtime")
    user = Bool(False, help="Install for the current user only.").tag(config=True)
    sys_prefix = Bool(False, help="Install into this Python environment (sys.prefix).").tag(
        config=True
    )
    prefix = Unicode("", help="Install under PREFIX/share/jupyter/kernels.").tag(config=True)

    aliases = {
        **GpuSchedCommand.aliases,
        "name": "KernelspecApp.kernel_name",
        "display-name": "KernelspecApp.display_name",
        **option_aliases("kernelspec", "KernelspecApp"),
        "prefix": "KernelspecApp.prefix",
    }
    flags = {
        **GpuSchedCommand.flags,
        "user": ({"KernelspecApp": {"user": True}}, "Install for the current user only."),
        "sys-prefix": (
            {"KernelspecApp": {"sys_prefix": True}},
            "Install into this Python environment (sys.prefix).",
        ),
    }
    verbs = ("add", "list")

    def check(self) -> None:
        """A verb; for ``add`` a valid name and a request a lease could hold."""
        from pydantic import ValidationError

        from jupyter_gpusched.client.options import request_fields
        from jupyter_gpusched.core.models import JobSubmission, invalid_field

        self.verb = self.positional("verb", at_least=1)[0]
        if self.verb not in self.verbs:
            raise UsageError(f"argument verb: {self.verb!r} is not one of {', '.join(self.verbs)}")
        self.positional("verb", at_most=1)
        if self.verb == "list":
            return
        if not self.kernel_name:
            raise UsageError("add needs --name, e.g. --name a100x2")
        if not _NAME.fullmatch(self.kernel_name):
            raise UsageError(
                f"argument --name: {self.kernel_name!r} may hold only letters, digits, . _ and -"
            )
        if sum((self.user, self.sys_prefix, bool(self.prefix))) > 1:
            raise UsageError("give at most one of --user, --sys-prefix and --prefix")
        values = {name: getattr(self, name) for name in self.trait_names(config=True)}
        self.fields, notes = request_fields("kernelspec", values)
        for note in notes:
            print(f"{self.prog}: note: {note}", file=sys.stderr)
        try:
            JobSubmission(kind="lease", **self.fields)
        except ValidationError as exc:
            raise UsageError(invalid_field(exc).message) from None

    def run(self) -> int:
        """Install the kernelspec, or list the GPU ones."""
        from jupyter_gpusched.client import kernelspecs

        if self.verb == "list":
            return self._list()
        prefix = sys.prefix if self.sys_prefix else (self.prefix or None)
        try:
            path = kernelspecs.install(
                self.kernel_name,
                self.fields,
                display_name=self.display_name or None,
                user=self.user,
                prefix=prefix,
            )
        except OSError as exc:
            print(
                f"{self.prog}: cannot install into {exc.filename or 'the kernels directory'}: "
                f"{exc.strerror or exc}; try --user or --sys-prefix",
                file=sys.stderr,
            )
            return 1
        spec = kernelspecs.kernel_spec(self.fields, self.display_name or None)
        print(f"installed kernelspec {self.kernel_name} ({spec['display_name']}) in {path}")
        return 0

    def _list(self) -> int:
        from jupyter_client.kernelspec import KernelSpecManager

        from jupyter_gpusched.client.kernelspecs import PROVISIONER_NAME, describe

        rows = []
        for name, found in sorted(KernelSpecManager().get_all_specs().items()):
            meta = found["spec"].get("metadata", {}).get("kernel_provisioner", {})
            if meta.get("provisioner_name") == PROVISIONER_NAME:
                config = meta.get("config", {})
                rows.append((name, found["spec"]["display_name"], describe(config)))
        if not rows:
            print("no GPU kernelspecs installed; add one with 'jupyter gpusched kernelspec add'")
            return 0
        widths = [max(len(r[i]) for r in rows) for i in (0, 1)]
        for name, display, asks in rows:
            print(f"{name:<{widths[0]}}  {display:<{widths[1]}}  {asks}")
        return 0
