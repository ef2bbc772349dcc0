"""ComfyUI's ``server`` module, what the custom nodes call of it (``server.py`` at 3cd7b32f): ``PromptServer.instance``
and its ``send_progress_text(text, node_id, sid=None)`` (l.1214-1224), which shows ``text`` under the node ``node_id``
in the browser. The double keeps what was sent, in order, as ``(node_id, text)``."""

from __future__ import annotations


class PromptServer:
    instance: PromptServer | None = None

    def __init__(self) -> None:
        PromptServer.instance = self
        self.texts: list[tuple[str, str]] = []

    def send_progress_text(self, text: str | bytes, node_id: str, sid=None) -> None:
        self.texts.append((str(node_id), text.decode("utf-8") if isinstance(text, bytes) else text))
