"""Settings → Tools: whether the assistant is offered tools, which ones, who decides, and the MCP servers.

Edits a copy of ``controller.tools_config`` (``tools.json``); the dialog's Save hands it to
``controller.apply_tools_config`` (a prepared conversation starts over with the new tool prompt). A server is added
by a name and a command line (started on demand over stdio) or a URL (Streamable HTTP); *List tools* asks it for its
tools off the UI thread, and they appear in the table when it answers (``ToolsListed``, :meth:`show_listed`), each
with its switch and its consent: the default for its kind (read-only tools run, others ask), always allow, ask every
time, or never. Main thread only.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import replace
from typing import Final

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.messages import ToolsListed
from app.tools.config import ServerConfig, ToolEntry, ToolsConfig, ToolsConfigError
from app.tools.runner import BUILTIN, MAX_OFFERED_TOOLS, builtin_entries

from .contracts import Controller
from .theme import muted_label

CONSENT_CHOICES: Final = (("always", "Always allow"), ("ask", "Ask every time"), ("never", "Never"))
OFFER_NOTE: Final = (
    "The assistant is told about at most five enabled tools in its system prompt (in the order below) and may call "
    "one while you talk; nothing runs without the consent you choose here. The model calls tools unreliably: in "
    "other ports it took the intended tool in about half the sessions, and 4-bit weights make its choice less sure. "
    "Every call, your answer and the result appear in the conversation and are kept in the history."
)


class ToolsSettingsPage(QWidget):
    """The Tools tab of the settings dialog."""

    def __init__(
        self, controller: Controller, show_error: Callable[[str], None], parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self._controller = controller
        self._show_error = show_error
        self.config = controller.tools_config

        offer_box = QGroupBox("Tools", self)
        self.offer_check = QCheckBox("Offer tools to the assistant", offer_box)
        self.offer_check.setChecked(self.config.offer_tools)
        self.offer_check.toggled.connect(lambda on: self._set(replace(self.config, offer_tools=on)))
        offer_layout = QVBoxLayout(offer_box)
        offer_layout.addWidget(self.offer_check)
        offer_layout.addWidget(muted_label(OFFER_NOTE, offer_box))

        tools_box = QGroupBox("Tools and consent", self)
        self.table = QTableWidget(0, 4, tools_box)
        self.table.setHorizontalHeaderLabels(["Tool", "From", "Offered", "Consent"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QTableWidget.SelectionMode.NoSelection)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in (1, 2, 3):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        self.table.setAccessibleName("Tools, whether each is offered, and its consent")
        tools_layout = QVBoxLayout(tools_box)
        tools_layout.addWidget(self.table)

        servers_box = QGroupBox("MCP servers", self)
        self.servers = QTableWidget(0, 3, servers_box)
        self.servers.setHorizontalHeaderLabels(["Name", "Command or URL", ""])
        self.servers.verticalHeader().hide()
        self.servers.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        servers_header = self.servers.horizontalHeader()
        servers_header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        servers_header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        servers_header.setSectionResizeMode(2, QHeaderView.ResizeMode.Fixed)
        self.server_name = QLineEdit(servers_box)
        self.server_name.setPlaceholderText("name, e.g. notes")
        self.server_name.setAccessibleName("New server's name")
        self.server_where = QLineEdit(servers_box)
        self.server_where.setPlaceholderText("command (uvx mcp-server-time) or URL (http://localhost:8000/mcp)")
        self.server_where.setAccessibleName("New server's command or URL")
        self.add_button = QPushButton("Add server", servers_box)
        self.add_button.clicked.connect(self.add_server)
        add_row = QHBoxLayout()
        add_row.addWidget(self.server_name, 1)
        add_row.addWidget(self.server_where, 3)
        add_row.addWidget(self.add_button)
        servers_layout = QVBoxLayout(servers_box)
        servers_layout.addWidget(self.servers)
        servers_layout.addLayout(add_row)
        servers_layout.addWidget(
            muted_label(
                "A command starts when a conversation first needs it, with only PATH, HOME and the few basics of "
                "your environment, and stops when Parley quits. Its messages go to the log folder.",
                servers_box,
            )
        )

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 12, 4, 4)
        layout.addWidget(offer_box)
        layout.addWidget(tools_box, 2)
        layout.addWidget(servers_box, 1)
        self._refresh()

    # -- editing ---------------------------------------------------------------------------------------------------

    def _set(self, config: ToolsConfig) -> None:
        self.config = config
        self._refresh()

    def add_server(self) -> None:
        """Add the server typed in the two fields (a command line or a URL); problems are shown, nothing is lost."""
        name, where = self.server_name.text().strip(), self.server_where.text().strip()
        try:
            if not where:
                raise ToolsConfigError("type the server's command or URL")
            if where.startswith(("http://", "https://")):
                server = ServerConfig(name, url=where)
            else:
                server = ServerConfig(name, tuple(shlex.split(where)))
            if self.config.server(name) is not None:
                raise ToolsConfigError(f"a server named {name!r} exists already")
        except ValueError as exc:  # ToolsConfigError, or shlex's unbalanced quotes
            self._error(f"The server could not be added: {exc}.")
            return
        self.server_name.clear()
        self.server_where.clear()
        self._set(self.config.with_server(server))

    def remove_server(self, name: str) -> None:
        self._set(self.config.without_server(name))

    def list_tools(self, name: str) -> None:
        """Ask the server for its tools (saved first, so the controller knows it)."""
        if self._controller.tools_config.server(name) != self.config.server(name):
            self._controller.apply_tools_config(replace(self._controller.tools_config, servers=self.config.servers))
        self._controller.list_server_tools(name)

    def show_listed(self, listed: ToolsListed) -> None:
        """A server answered: its tools join the table (the choices already made for them are kept)."""
        server = self.config.server(listed.server)
        if server is not None:
            self._set(self.config.with_server(server.with_listed(tuple(listed.tools))))

    def _choice_changed(self, source: str, tool: ToolEntry, enabled: bool, consent: str | None) -> None:
        self.config = self.config.with_choice(source, tool.name, enabled=enabled, consent=consent)

    def _error(self, message: str) -> None:
        self._show_error(message)

    # -- the tables ------------------------------------------------------------------------------------------------

    def _rows(self) -> list[tuple[str, ToolEntry]]:
        rows = [(BUILTIN, tool) for tool in builtin_entries(self.config)]
        for server in self.config.servers:
            rows += [(server.name, tool) for tool in server.tools]
        return rows

    def _refresh(self) -> None:
        rows = self._rows()
        _clear(self.table)
        _clear(self.servers)
        self.table.setRowCount(len(rows))
        for row, (source, tool) in enumerate(rows):
            name = QTableWidgetItem(tool.name)
            name.setToolTip(tool.description or tool.name)
            self.table.setItem(row, 0, name)
            self.table.setItem(row, 1, QTableWidgetItem("built-in" if source == BUILTIN else source))
            offered = QCheckBox(self.table)
            offered.setChecked(tool.enabled)
            offered.setAccessibleName(f"Offer {tool.name}")
            consent = QComboBox(self.table)
            default = "Always allow" if tool.read_only else "Ask every time"
            consent.addItem(f"Default ({default.lower()})", None)
            for value, label in CONSENT_CHOICES:
                consent.addItem(label, value)
            consent.setCurrentIndex(max(0, consent.findData(tool.consent)) if tool.consent is not None else 0)
            consent.setAccessibleName(f"Consent for {tool.name}")

            def changed(*_: object, source: str = source, tool: ToolEntry = tool) -> None:
                widgets = self._row_widgets(source, tool.name)
                if widgets is not None:
                    check, combo = widgets
                    self._choice_changed(source, tool, check.isChecked(), combo.currentData())

            offered.toggled.connect(changed)
            consent.currentIndexChanged.connect(changed)
            self.table.setCellWidget(row, 2, offered)
            self.table.setCellWidget(row, 3, consent)
        enabled = sum(1 for _, tool in rows if tool.enabled and tool.policy != "never")
        self.table.setToolTip(
            f"{enabled} tools are on; the first {MAX_OFFERED_TOOLS} are offered" if enabled > MAX_OFFERED_TOOLS else ""
        )
        self.servers.setRowCount(len(self.config.servers))
        for row, server in enumerate(self.config.servers):
            self.servers.setItem(row, 0, QTableWidgetItem(server.name))
            self.servers.setItem(row, 1, QTableWidgetItem(server.where))
            actions = QWidget(self.servers)
            buttons = QHBoxLayout(actions)
            buttons.setContentsMargins(2, 0, 2, 0)
            listing = QPushButton("List tools", actions)
            listing.clicked.connect(lambda _=False, name=server.name: self.list_tools(name))
            remove = QPushButton("Remove", actions)
            remove.clicked.connect(lambda _=False, name=server.name: self.remove_server(name))
            buttons.addWidget(listing)
            buttons.addWidget(remove)
            self.servers.setCellWidget(row, 2, actions)
            self.servers.setColumnWidth(2, actions.sizeHint().width())
        self.table.setEnabled(self.config.offer_tools)
        self.table.resizeRowsToContents()
        self.servers.resizeRowsToContents()

    def _row_widgets(self, source: str, name: str) -> tuple[QCheckBox, QComboBox] | None:
        label = "built-in" if source == BUILTIN else source
        for row in range(self.table.rowCount()):
            tool_item, source_item = self.table.item(row, 0), self.table.item(row, 1)
            if (
                tool_item is not None
                and source_item is not None
                and (tool_item.text(), source_item.text())
                == (
                    name,
                    label,
                )
            ):
                check, combo = self.table.cellWidget(row, 2), self.table.cellWidget(row, 3)
                if isinstance(check, QCheckBox) and isinstance(combo, QComboBox):
                    return check, combo
        return None

    def tool_rows(self) -> list[tuple[str, str, bool, str]]:
        """(tool, from, offered, consent shown) per row, for tests and accessibility checks."""
        out = []
        for row in range(self.table.rowCount()):
            check, combo = self.table.cellWidget(row, 2), self.table.cellWidget(row, 3)
            tool, source = self.table.item(row, 0), self.table.item(row, 1)
            assert isinstance(check, QCheckBox) and isinstance(combo, QComboBox)
            assert tool is not None and source is not None
            out.append((tool.text(), source.text(), check.isChecked(), combo.currentText()))
        return out


def _clear(table: QTableWidget) -> None:
    """Empty ``table``, its cell widgets hidden at once (they are deleted later, by the event loop)."""
    for row in range(table.rowCount()):
        for column in range(table.columnCount()):
            widget = table.cellWidget(row, column)
            if widget is not None:
                widget.hide()
    table.clearContents()
    table.setRowCount(0)
