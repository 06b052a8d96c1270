"""The few messages a remote kernel's manager sends it itself, over the forwarded ports.

The Jupyter server's own channels carry the notebook's traffic; the provisioner needs only a
``kernel_info_request`` on the control channel (is it up, and which process is it: the lease
kernel says its pid), ``interrupt_request`` / ``shutdown_request``, and a heartbeat to notice
forwards that dropped. Each uses a socket of its own, signed with the kernel's session key and
CurveZMQ-encrypted like every other client of a lease kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.session import Session


class KernelWire:
    """Control requests and heartbeats to the kernel at ``info`` (a connection dict)."""

    def __init__(self, info: Mapping[str, Any]) -> None:
        self.info = dict(info)
        key = self.info.get("key", b"")
        self.session = Session(
            key=key if isinstance(key, bytes) else str(key).encode(),
            signature_scheme=str(self.info.get("signature_scheme") or "hmac-sha256"),
            username="gpusched",
        )
        self._hb: zmq.asyncio.Socket | None = None

    def _socket(self, kind: int, port_key: str) -> zmq.asyncio.Socket:
        sock = zmq.asyncio.Context.instance().socket(kind)
        sock.linger = 0
        public = self.info.get("curve_publickey")
        if public:  # as jupyter_client does: the kernel's keypair, and it as the server key
            pub = public.encode() if isinstance(public, str) else public
            sec = self.info["curve_secretkey"]
            sock.curve_secretkey = sec.encode() if isinstance(sec, str) else sec
            sock.curve_publickey = pub
            sock.curve_serverkey = pub
        sock.connect(f"tcp://{self.info['ip']}:{int(self.info[port_key])}")
        return sock

    async def request(
        self, msg_type: str, content: dict[str, Any] | None = None, *, timeout_s: float = 5.0
    ) -> dict[str, Any] | None:
        """Send one control request; the reply's content, or None without one in time."""
        sock = self._socket(zmq.DEALER, "control_port")
        try:
            msg = self.session.msg(msg_type, content or {})
            await sock.send_multipart(self.session.serialize(msg))
            deadline = time.monotonic() + timeout_s
            while (left := deadline - time.monotonic()) > 0:
                try:
                    frames = await asyncio.wait_for(sock.recv_multipart(), left)
                except TimeoutError:
                    return None
                _, parts = self.session.feed_identities(frames)
                reply = self.session.deserialize(parts)
                if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                    return dict(reply["content"])
            return None
        finally:
            sock.close(linger=0)

    async def kernel_pid(self, *, timeout_s: float = 1.0) -> int | None:
        """The kernel's pid from its ``kernel_info_reply``; None when it does not answer.

        Kernels that do not say their pid (not a lease kernel) answer 0.
        """
        reply = await self.request("kernel_info_request", timeout_s=timeout_s)
        if reply is None:
            return None
        return int((reply.get("gpusched") or {}).get("pid") or 0)

    async def beat(self, *, timeout_s: float = 2.0) -> bool:
        """One heartbeat: whether the kernel echoed in time (through the forwards)."""
        if self._hb is None:
            self._hb = self._socket(zmq.REQ, "hb_port")
        try:
            await self._hb.send(b"gpusched-ping")
            await asyncio.wait_for(self._hb.recv(), timeout_s)
            return True
        except (TimeoutError, zmq.ZMQError):
            self.close()  # a REQ socket that missed its reply cannot send again
            return False

    def close(self) -> None:
        """Close the heartbeat socket (control sockets close after each request)."""
        if self._hb is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._hb.close(linger=0)
            self._hb = None
