"""A headless visitor that speaks Streamlit's own websocket protocol (the load test's ~28 students).

A browser tab of a Streamlit app is one websocket, ``/_stcore/stream`` (subprotocol
``streamlit``), carrying protobufs that ship inside the ``streamlit`` package:

* the tab sends a ``BackMsg`` whose ``rerun_script`` is a ``ClientState``: the URL's query
  string, the page (``page_name``, its URL path; ``page_script_hash`` once known) and the
  widget states (``WidgetStates``: one ``WidgetState`` per widget, by its id);
* the server answers with ``ForwardMsg``\\ s: ``new_session``, ``session_status_changed``,
  ``navigation`` (the page's script hash), ``page_info_changed`` (the URL's query string), one
  ``delta`` per element (``new_element`` of type ``plotly_chart``, ``exception``, ``alert`` …,
  placed at ``metadata.delta_path``), then ``script_finished``.

:class:`Visitor` opens a page as a tab does (its first ``rerun_script`` carries no widget
state, exactly what Chromium sends), records every run (:class:`Run`: when its first chart
arrived, its exceptions, error and warning boxes, its text) and moves one control the way the
frontend does after a slider step: a ``rerun_script`` with the query string the app last wrote
and the widget's new value. It sends only the states of the widgets it changed: the server keeps every
other widget's value from the previous run (``SessionState.set_widgets_from_proto`` sets just the
states given), so the page runs with the same values a browser would send.

Everything is asyncio: thirty visitors are thirty coroutines in one thread of the test.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit

from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from websockets.asyncio.client import ClientConnection, connect

FINISHED = ForwardMsg.ScriptFinishedStatus
ERROR, WARNING, INFO = 1, 2, 3  # streamlit.proto.Alert_pb2.Alert.Format


@dataclass
class Run:
    """One script run as one visitor received it; times are ``time.perf_counter()`` seconds."""

    sent: float
    """When the ``rerun_script`` that asked for it was sent (or the socket was opened)."""
    first_chart: float | None = None
    """When the first ``plotly_chart`` delta arrived."""
    finished: float | None = None
    charts: int = 0
    exceptions: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """Bodies of ``st.error`` boxes."""
    warnings: list[str] = field(default_factory=list)
    infos: list[str] = field(default_factory=list)
    """Bodies of ``st.info`` boxes (the queue's "Queued: 2nd in line …")."""
    text: list[str] = field(default_factory=list)
    """Markdown, captions and headings, in arrival order (what the visitor reads)."""
    bytes: int = 0

    @property
    def first_chart_s(self) -> float | None:
        return None if self.first_chart is None else self.first_chart - self.sent

    @property
    def seconds(self) -> float | None:
        """From the request to ``script_finished``."""
        return None if self.finished is None else self.finished - self.sent


class ProtocolError(RuntimeError):
    """The server sent what this client does not handle (a changed protocol, not a slow server)."""


class Visitor:
    """One tab on ``base`` (``http://127.0.0.1:PORT``): :meth:`open` a page, :meth:`step` a slider."""

    def __init__(self, base: str, name: str = "visitor"):
        self.base, self.name = base.rstrip("/"), name
        self.ws: ClientConnection | None = None
        self.page_name = ""
        self.page_hash = ""
        self.query: list[tuple[str, str]] = []
        self.widgets: dict[str, str] = {}
        """URL key (a widget's ``key``) -> its widget id, from the elements received."""
        self.runs: list[Run] = []

    async def open(self, path_and_query: str, timeout: float) -> Run:
        """Connect and run the page ``/path?query`` as a fresh tab does; return that run."""
        url = urlsplit(path_and_query)
        self.page_name = url.path.strip("/")
        self.query = parse_qsl(url.query, keep_blank_values=True)
        run = Run(sent=time.perf_counter())
        ws_url = self.base.replace("http://", "ws://", 1) + "/_stcore/stream"
        self.ws = await connect(
            ws_url, subprotocols=["streamlit"], max_size=64 << 20, open_timeout=timeout, ping_interval=None
        )
        await self._send(widgets={})
        return await self._receive(run, timeout)

    async def step(self, key: str, value: float, timeout: float) -> Run:
        """Move the slider of URL key ``key`` to ``value`` and return the run it starts. The query
        sent is the one the app last wrote (``page_info_changed``): no widget is bound to the URL,
        the app writes it after the run reads the new value (:mod:`hessviz.app.address`)."""
        widget = self.widgets.get(key)
        if widget is None:
            raise ProtocolError(f"{self.name}: no widget with key {key!r} among {sorted(self.widgets)}")
        run = Run(sent=time.perf_counter())  # the query stays what the app last wrote, as in a tab
        await self._send(widgets={widget: float(value)})
        return await self._receive(run, timeout)

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()

    async def _send(self, widgets: dict[str, float]) -> None:
        msg = BackMsg()
        state = msg.rerun_script
        state.query_string = urlencode(self.query)
        state.page_name = self.page_name
        state.page_script_hash = self.page_hash
        state.widget_states.SetInParent()
        for widget_id, value in widgets.items():
            w = state.widget_states.widgets.add()
            w.id = widget_id
            w.double_array_value.data.append(value)  # a slider's value, as the frontend sends it
        await self.ws.send(msg.SerializeToString())

    async def _receive(self, run: Run, timeout: float) -> Run:
        """Read messages until this request's run has finished (a run the server itself restarts,
        ``FINISHED_EARLY_FOR_RERUN``, is followed by the run that counts)."""
        deadline = run.sent + timeout
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError(f"{self.name}: the run did not finish within {timeout:g} s")
            data = await asyncio.wait_for(self.ws.recv(), left)
            run.bytes += len(data)
            msg = ForwardMsg()
            msg.ParseFromString(data)
            kind = msg.WhichOneof("type")
            if kind == "ref_hash":
                raise ProtocolError(
                    f"{self.name}: a cached-message reference, but this client announced no cached messages"
                )
            if kind == "page_info_changed":
                self.query = parse_qsl(msg.page_info_changed.query_string, keep_blank_values=True)
            elif kind == "navigation":  # st.navigation names the page run
                self.page_hash = msg.navigation.page_script_hash or self.page_hash
            elif kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
                self._element(run, msg.delta.new_element)
            elif kind == "script_finished":
                if msg.script_finished == FINISHED.FINISHED_EARLY_FOR_RERUN:
                    continue
                if msg.script_finished == FINISHED.FINISHED_WITH_COMPILE_ERROR:
                    run.exceptions.append("the script did not compile")
                run.finished = time.perf_counter()
                self.runs.append(run)
                return run

    def _element(self, run: Run, element) -> None:
        kind = element.WhichOneof("type")
        if kind == "plotly_chart":
            run.charts += 1
            if run.first_chart is None:
                run.first_chart = time.perf_counter()
        elif kind == "exception":
            run.exceptions.append(f"{element.exception.type}: {element.exception.message}"[:500])
        elif kind == "alert":
            box = {ERROR: run.errors, WARNING: run.warnings, INFO: run.infos}.get(element.alert.format)
            if box is not None:
                box.append(element.alert.body[:500])
        elif kind in ("markdown", "heading"):
            run.text.append(getattr(element, kind).body)
        else:
            proto = getattr(element, kind)
            widget_id = getattr(proto, "id", "")
            if widget_id.startswith("$$ID-"):  # "$$ID-<hash>-<key>" for a keyed widget
                self.widgets[widget_id.split("-", 2)[2]] = widget_id
