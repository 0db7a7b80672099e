"""The AM's data checkpoint calls, as JSON over HTTP, with the standard library alone.

The AM serves them on the port of its gRPC API, the address in ``SLUICE_AM`` (``host:port``, or a
URL such as ``http://host:port``), so the package needs no gRPC stack and the native module links
only the ring:

- ``POST /api/v1/checkpoints/commit`` takes one rank's position at a step and answers
  ``{"token": ...}`` once every rank of the step has reported, ``{"pending": {...}}`` before;
- ``POST /api/v1/checkpoints/restore`` takes ``{"token": ..., "rank": ...}`` and answers
  ``{"step", "epoch", "effect"}``;
- ``POST /api/v1/job`` takes ``{}`` and answers ``{"job_id", "world_size"}``: a trainer that
  someone else launched learns there the job directory its ring is in.

With the AM's shared token (``SLUICE_TOKEN``), every call carries ``Authorization: Bearer <token>``.
An AM that serves TLS is addressed as ``https://host:port``, or as ``host:port`` with
``SLUICE_TLS_CA`` naming the CA that signed its certificate (without it, the system's roots).
A refused call answers with an HTTP error status and ``{"code", "message"}``. The calls go straight
to the AM: proxy settings of the environment (``http_proxy``) do not apply to them.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import time
import urllib.parse
from typing import Any, Dict, List, Optional, Tuple

from sluice._native import SluiceError

COMMIT_PATH = "/api/v1/checkpoints/commit"
RESTORE_PATH = "/api/v1/checkpoints/restore"
JOB_PATH = "/api/v1/job"

# How often a commit asks again while other ranks of its step have not reported.
_POLL_S = 0.02

# What a restore may do to the trainers (see sluice.Reader.load_state_dict).
_EFFECTS = ("already_there", "trainers_restart", "rings_replaced")


class _AmConnection:
    """One HTTP connection to the AM at ``am``, kept open across the calls of one checkpoint."""

    def __init__(self, am: str, token: Optional[str], timeout_s: float) -> None:
        self.am = am
        ca = os.environ.get("SLUICE_TLS_CA")
        # A bare host:port means TLS when a CA is given, as for the other clients of the AM.
        address = am if "://" in am else (f"https://{am}" if ca else f"http://{am}")
        try:
            parts = urllib.parse.urlsplit(address)
            host, port = parts.hostname, parts.port
        except ValueError as error:
            raise SluiceError(f"AM address {am!r}: {error}; check SLUICE_AM") from None
        if parts.scheme not in ("http", "https") or not host:
            raise SluiceError(f"AM address {am!r}: expected host:port or an http:// URL; check SLUICE_AM")
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token is not None:
            if not token.isascii() or not token.isprintable():
                raise SluiceError("SLUICE_TOKEN: the token must be printable ASCII; set it to the AM's token")
            self._headers["Authorization"] = f"Bearer {token}"
        if parts.scheme == "http" and ca:
            raise SluiceError(f"AM address {am!r} says plain TCP (http://) but SLUICE_TLS_CA is set; use https:// or unset it")
        self._timeout_s = timeout_s
        if parts.scheme == "https":
            try:
                context = ssl.create_default_context(cafile=ca)
            except (OSError, ssl.SSLError) as error:
                raise SluiceError(f"SLUICE_TLS_CA={ca!r}: {error}; point it at the PEM file of the CA that signed the AM's certificate") from None
            self._connection = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=context)
        else:
            self._connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
        self._used = False

    def close(self) -> None:
        self._connection.close()

    def call(self, path: str, body: Dict[str, Any], what: str) -> Dict[str, Any]:
        """POSTs ``body`` to ``path`` and returns the JSON answer; raises :class:`SluiceError` naming
        ``what`` was asked when the AM cannot be reached or refuses."""
        payload = json.dumps(body).encode()
        try:
            try:
                status, reason, answer = self._post(path, payload)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if not self._used:
                    raise
                # The AM closed the connection kept open since the previous call: open a new one.
                self._connection.close()
                status, reason, answer = self._post(path, payload)
        except (TimeoutError, socket.timeout):
            self._connection.close()
            raise SluiceError(
                f"the AM at {self.am} did not answer {what} within {self._timeout_s:.1f} s; check that the AM runs, "
                "or raise checkpoint_timeout_s"
            ) from None
        except http.client.HTTPException as error:
            self._connection.close()
            raise SluiceError(
                f"the AM at {self.am} broke off {what}: {str(error) or type(error).__name__}; check SLUICE_AM, and that the "
                "AM is of this client's version"
            ) from None
        except ssl.SSLCertVerificationError as error:
            self._connection.close()
            raise SluiceError(
                f"the AM at {self.am} shows a certificate this client does not trust ({error.verify_message}); set SLUICE_TLS_CA "
                "to the CA that signed it"
            ) from None
        except ssl.SSLError as error:
            self._connection.close()
            raise SluiceError(
                f"TLS with the AM at {self.am} failed ({error.reason}); if the AM serves plain TCP, address it as http://host:port "
                "and unset SLUICE_TLS_CA"
            ) from None
        except OSError as error:
            self._connection.close()
            raise SluiceError(f"cannot reach the AM at {self.am}: {error}; check SLUICE_AM and that the AM runs") from None
        self._used = True
        try:
            reply = json.loads(answer)
        except ValueError:
            reply = None
        if status == 200 and isinstance(reply, dict):
            return reply
        if isinstance(reply, dict) and isinstance(reply.get("message"), str):
            message = reply["message"]
        else:
            text = answer.decode("utf-8", "replace").strip()[:200]
            message = f"HTTP {status} {reason}: {text!r}, not the JSON answer of an AM of this client's version"
        raise SluiceError(f"the AM at {self.am} refused {what}: {message}")

    def _post(self, path: str, payload: bytes) -> Tuple[int, str, bytes]:
        self._connection.request("POST", path, body=payload, headers=self._headers)
        response = self._connection.getresponse()
        return response.status, response.reason, response.read()


def commit_data_checkpoint(
    am: str,
    token: Optional[str],
    step: int,
    rank: int,
    world_size: int,
    epoch: int,
    positions: List[Tuple[int, int]],
    timeout_s: float,
) -> str:
    """Commits this rank's data position at ``step`` to the AM at ``am``, and waits up to
    ``timeout_s`` for every rank of the step to report; returns the checkpoint's token."""
    request = {
        "step": step,
        "rank": rank,
        "world_size": world_size,
        "epoch": epoch,
        "positions": [{"task_id": task_id, "end_row": end_row} for task_id, end_row in positions],
    }
    what = f"the data checkpoint of step {step}"
    connection = _AmConnection(am, token, timeout_s)
    started = time.monotonic()
    try:
        while True:
            reply = connection.call(COMMIT_PATH, request, what)
            if isinstance(reply.get("token"), str):
                return reply["token"]
            pending = reply.get("pending")
            if not isinstance(pending, dict):
                raise SluiceError(f"the AM at {am} answered {what} with neither a token nor a pending state: {reply!r}")
            elapsed = time.monotonic() - started
            if elapsed >= timeout_s:
                raise SluiceError(
                    f"data checkpoint of step {step}: {pending.get('ranks_reported')} of {pending.get('world_size')} ranks "
                    f"reported after {elapsed:.1f} s; every rank must call state_dict() at the same step, or raise the timeout"
                )
            time.sleep(_POLL_S)
    finally:
        connection.close()


def restore_data_checkpoint(am: str, token: Optional[str], checkpoint: str, rank: int, timeout_s: float) -> str:
    """Asks the AM at ``am``, as rank ``rank``, to restore the data checkpoint named ``checkpoint``,
    within ``timeout_s``; returns what the restore does: ``"already_there"`` (read on),
    ``"trainers_restart"`` (the AM stops this trainer and launches it again) or ``"rings_replaced"``
    (read the ring once the daemon has created it anew). A rank that asks for the checkpoint the
    job was restored to, after other ranks asked and read on, reads on from there too."""
    connection = _AmConnection(am, token, timeout_s)
    try:
        reply = connection.call(
            RESTORE_PATH, {"token": checkpoint, "rank": rank}, f"the restore of data checkpoint {checkpoint}"
        )
    finally:
        connection.close()
    effect = reply.get("effect")
    if effect not in _EFFECTS:
        raise SluiceError(
            f"the AM at {am} restored data checkpoint {checkpoint} without saying what it does to the trainers "
            f"(effect {effect!r}); run an AM of this client's version"
        )
    return effect


def job_of(am: str, token: Optional[str], timeout_s: float) -> Tuple[str, int]:
    """Asks the AM at ``am`` which job it runs; returns the job's id and its number of trainers."""
    connection = _AmConnection(am, token, timeout_s)
    try:
        reply = connection.call(JOB_PATH, {}, "the job's name")
    finally:
        connection.close()
    job_id, world_size = reply.get("job_id"), reply.get("world_size")
    if not isinstance(job_id, str) or not isinstance(world_size, int):
        raise SluiceError(f"the AM at {am} answered the job's name with {reply!r}; run an AM of this client's version")
    return job_id, world_size
