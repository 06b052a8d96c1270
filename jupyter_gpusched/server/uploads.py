"""Files and notebooks that travel with a request, instead of a path only one host can read.

A user's server in client mode reads what its user named by path -- only from inside its root
-- and sends the content (:func:`inline_files`, :func:`inline_notebook`); the service writes it
into that user's private directory (:func:`check_uploads`, :func:`kept_notebook`), from where
the job is staged onto its node. Sizes are bounded on both sides; what a request sends is
checked whole before anything is written, and taken away again if the request fails.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import posixpath
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from jupyter_gpusched.core.errors import ConflictError, InvalidSpecError, NotFoundError

#: Largest single file, and all files of one request together, as raw bytes.
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_UPLOAD_BYTES = 64 * 1024 * 1024
#: Most files one request may carry (a directory counts each file in it).
MAX_FILES = 1000


def inside(root: str, path: str) -> str:
    """``path`` (absolute, or relative to ``root``) resolved, refusing anything outside root."""
    real_root = os.path.realpath(root)
    full = os.path.realpath(path if os.path.isabs(path) else os.path.join(real_root, path))
    if os.path.commonpath([full, real_root]) != real_root:
        raise InvalidSpecError(
            "files", f"{path!r} is outside your Jupyter root {real_root}; move it there first"
        )
    return full


def local_files(paths: Any, root: str) -> list[str]:
    """A job's ``files`` as absolute paths inside ``root``; anything leading out is refused.

    For a server that stages files from its own disk (embedded mode): the files go onto the
    node as the job's owner, so they must be the owner's -- under the root they work in --
    never the server's keys or ``/etc/shadow``. Links inside a directory are followed when
    staged, so each must stay inside the root too.
    """
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise InvalidSpecError("files", "must be a list of paths")
    out = []
    for path in paths:
        full = inside(root, path)
        if not os.path.exists(full):
            raise InvalidSpecError("files", f"{path!r} not found under your Jupyter root")
        seen: set[str] = set()
        folders = [full] if os.path.isdir(full) else []
        while folders:
            folder = folders.pop()
            if folder in seen:
                continue
            seen.add(folder)
            for name in os.listdir(folder):
                target = inside(root, os.path.join(folder, name))  # refuses links leading out
                if os.path.isdir(target):
                    folders.append(target)
        out.append(full)
    return out


def inline_files(spec: dict[str, Any], root: str) -> None:
    """Replace ``spec["files"]`` (paths inside ``root``) by ``spec["uploads"]`` (contents)."""
    paths = spec.pop("files", None)
    if not paths:
        return
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise InvalidSpecError("files", "must be a list of paths")
    uploads: list[dict[str, Any]] = []
    total = 0
    for path in paths:
        full = inside(root, path)
        if not os.path.exists(full):
            raise InvalidSpecError("files", f"{path!r} not found under your Jupyter root")
        base = os.path.dirname(full)
        walk = [full] if os.path.isfile(full) else _files_under(full)
        for name in walk:
            info = os.stat(name)
            total += info.st_size
            if info.st_size > MAX_FILE_BYTES or total > MAX_UPLOAD_BYTES:
                raise InvalidSpecError(
                    "files",
                    f"{path!r} is too large to send with the job (at most "
                    f"{MAX_FILE_BYTES >> 20} MB a file, {MAX_UPLOAD_BYTES >> 20} MB in all); "
                    "put large data where the nodes can read it and pass its path",
                )
            with open(name, "rb") as f:
                content = base64.b64encode(f.read()).decode("ascii")
            rel = os.path.relpath(name, base).replace(os.sep, "/")
            uploads.append({"name": rel, "content_base64": content, "mode": info.st_mode & 0o777})
    if len(uploads) > MAX_FILES:
        raise InvalidSpecError("files", f"more than {MAX_FILES} files; send an archive instead")
    spec["uploads"] = uploads


def _files_under(folder: str) -> list[str]:
    out = []
    for dirpath, _, names in os.walk(folder):
        out.extend(os.path.join(dirpath, n) for n in sorted(names))
    return out


def inline_notebook(request: dict[str, Any], root: str) -> None:
    """Add the notebook's ``content`` to a notebook request naming it by path under ``root``."""
    path = request.get("notebook")
    if not isinstance(path, str) or "content" in request:
        return
    full = inside(root, path)
    if not os.path.isfile(full):
        raise NotFoundError(f"notebook {path!r} not found under your Jupyter root")
    if os.path.getsize(full) > MAX_FILE_BYTES:
        raise InvalidSpecError("notebook", f"larger than {MAX_FILE_BYTES >> 20} MB")
    with open(full, encoding="utf-8") as f:
        request["content"] = json.load(f)
    request["notebook"] = os.path.relpath(full, os.path.realpath(root)).replace(os.sep, "/")


def _private_dir(path: str) -> str:
    """``path`` as a folder only this server's user enters; missing parents are made 0700."""
    from jupyter_gpusched.node.stage import private_folder

    private_folder(path)
    os.chmod(path, 0o700)
    return path


def user_dir(data_dir: str, user: str) -> str:
    """A user's private directory under the service's data dir (0700)."""
    if not user or user in (".", "..") or "/" in user or "\0" in user:
        raise InvalidSpecError("user", f"{user!r} cannot name a directory")
    _private_dir(os.path.join(data_dir, "users"))
    return _private_dir(os.path.join(data_dir, "users", user))


def safe_relative(name: str, field: str) -> str:
    """``name`` as a relative POSIX path that stays where it is put (no ``..``, no root)."""
    norm = posixpath.normpath(name.replace("\\", "/"))
    if not name or norm.startswith(("/", "../")) or norm in (".", "..") or "\0" in name:
        raise InvalidSpecError(field, f"{name!r} is not a relative path inside your directory")
    return norm


@dataclass(frozen=True)
class PendingUploads:
    """Uploads checked whole and given their places, not yet written (:func:`check_uploads`).

    Nothing reaches the disk before the job they come with was checked too; a request that
    fails after :meth:`write` takes them away again (the handlers' ``on_finish``).
    """

    # The fresh private folder they go into.
    target: str
    # (path relative to target, bytes, mode) of each file.
    files: tuple[tuple[str, bytes, int], ...]
    # What the job stages: each top-level file or folder, in the order first named.
    tops: tuple[str, ...]

    @property
    def size(self) -> int:
        """Bytes of all the files together."""
        return sum(len(data) for _, data, _ in self.files)

    def write(self) -> None:
        """Write the files (0700 folders; files with their owner's mode bits only)."""
        _private_dir(os.path.dirname(self.target))
        _private_dir(self.target)
        for rel, data, mode in self.files:
            dest = os.path.join(self.target, rel)
            os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(dest, mode | stat.S_IRUSR)


def check_uploads(uploads: Any, folder: str) -> PendingUploads:
    """Check every upload (names, base64, sizes, names that collide) before any is written.

    They go into a fresh directory under ``folder``; its top-level entries are what to stage.
    """
    if not isinstance(uploads, list) or len(uploads) > MAX_FILES:
        raise InvalidSpecError("uploads", f"must be a list of at most {MAX_FILES} files")
    files: list[tuple[str, bytes, int]] = []
    named: dict[str, int] = {}  # each file's path -> its index
    folders: dict[str, int] = {}  # each folder the files need -> the first file needing it
    total = 0
    for i, item in enumerate(uploads):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidSpecError(f"uploads.{i}", 'must be {"name", "content_base64", "mode"}')
        rel = safe_relative(item["name"], f"uploads.{i}.name")
        clash = named.get(rel, folders.get(rel))
        parents = _parents(rel)
        clash = next((named[p] for p in parents if p in named), clash)
        if clash is not None:
            raise InvalidSpecError(
                f"uploads.{i}.name",
                f"{rel!r} collides with upload {clash} ({uploads[clash].get('name')!r}): one "
                "path cannot be a file twice, or both a file and a folder",
            )
        named[rel] = i
        for parent in parents:
            folders.setdefault(parent, i)
        try:
            data = base64.b64decode(str(item.get("content_base64", "")), validate=True)
        except (binascii.Error, ValueError):
            raise InvalidSpecError(f"uploads.{i}.content_base64", "is not base64") from None
        total += len(data)
        if len(data) > MAX_FILE_BYTES or total > MAX_UPLOAD_BYTES:
            raise InvalidSpecError(
                f"uploads.{i}",
                f"too large (at most {MAX_FILE_BYTES >> 20} MB a file, "
                f"{MAX_UPLOAD_BYTES >> 20} MB in all)",
            )
        mode = item.get("mode", 0o600)
        if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
            raise InvalidSpecError(f"uploads.{i}.mode", "must be Unix mode bits, e.g. 420")
        files.append((rel, data, mode & 0o700 or 0o600))  # the owner's bits only
    target = os.path.join(folder, uuid.uuid4().hex[:12])
    tops = dict.fromkeys(os.path.join(target, rel.split("/", 1)[0]) for rel, _, _ in files)
    return PendingUploads(target, tuple(files), tuple(tops))


def _parents(rel: str) -> list[str]:
    """The folders of a relative path, outermost first: ``a/b/c`` -> ``a``, ``a/b``."""
    parts = rel.split("/")
    return ["/".join(parts[:n]) for n in range(1, len(parts))]


@contextlib.contextmanager
def kept_notebook(content: Any, rel: str, folder: str) -> Iterator[str]:
    """Keep a notebook's JSON ``content`` at ``folder/rel`` (0600) while the block runs.

    Checked before anything is written; if the block fails, the notebook that was there
    before (or nothing) is put back, so a refused request leaves the folder as it found it.
    """
    if not isinstance(content, dict) or "cells" not in content:
        raise InvalidSpecError("content", "must be the notebook's JSON (an object with cells)")
    rel = safe_relative(rel, "notebook")
    if not rel.endswith(".ipynb"):
        raise InvalidSpecError("notebook", f"{rel!r} is not a notebook (.ipynb)")
    text = json.dumps(content)
    if len(text) > MAX_FILE_BYTES:
        raise InvalidSpecError("content", f"larger than {MAX_FILE_BYTES >> 20} MB")
    root = _private_dir(folder)
    dest = os.path.join(root, rel)
    for parent in _parents(rel):
        if os.path.lexists(path := os.path.join(root, parent)) and not os.path.isdir(path):
            raise ConflictError(
                f"notebook {rel!r}: {parent!r} is a file the service keeps for you, so it "
                "cannot be a folder too; give the notebook another path"
            )
    if os.path.isdir(dest):
        raise ConflictError(
            f"notebook {rel!r} is a folder of notebooks the service keeps for you; give the "
            "notebook another path"
        )
    made = [p for p in (os.path.join(root, q) for q in _parents(rel)) if not os.path.exists(p)]
    os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
    tmp = f"{dest}.{uuid.uuid4().hex[:8]}.tmp"
    before = f"{dest}.{uuid.uuid4().hex[:8]}.before"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    had = os.path.isfile(dest)
    if had:
        os.link(dest, before)
    os.replace(tmp, dest)
    try:
        yield dest
    except BaseException:
        if had:
            os.replace(before, dest)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(dest)
            for folder_made in reversed(made):
                with contextlib.suppress(OSError):  # only while empty
                    os.rmdir(folder_made)
        raise
    else:
        if had:
            os.unlink(before)
