"""Help → About: what is running (Parley, MLX, the device, …) and where its files are, with "Copy diagnostics".

The facts come from ``controller.diagnostics()``; the copied text is the same list as
"name: value" lines, ready to paste into a bug report. Main thread only.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLabel, QPushButton, QVBoxLayout, QWidget


def diagnostics_text(facts: dict[str, str]) -> str:
    return "\n".join(f"{name}: {value}" for name, value in facts.items()) + "\n"


class AboutDialog(QDialog):
    """Versions, device and folders; "Copy diagnostics" puts them on the clipboard."""

    def __init__(self, facts: dict[str, str], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.facts = dict(facts)
        self.setWindowTitle("About Parley")
        self.setMinimumWidth(520)
        title = QLabel("Parley", self)
        title.setProperty("role", "title")
        blurb = QLabel(
            "A push-to-talk voice assistant running NVIDIA's NemotronLabs VoiceChat 11B on this computer, with MLX.",
            self,
        )
        blurb.setWordWrap(True)
        blurb.setProperty("role", "muted")
        form = QFormLayout()
        form.setSpacing(6)
        self.value_labels: dict[str, QLabel] = {}
        for name, value in self.facts.items():
            label = QLabel(value, self)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            label.setWordWrap(True)
            form.addRow(f"{name}:", label)
            self.value_labels[name] = label
        self.copied = QLabel("", self)
        self.copied.setProperty("role", "muted")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        self.copy_button = QPushButton("Copy diagnostics", self)
        self.copy_button.setAccessibleName("Copy the diagnostics to the clipboard")
        buttons.addButton(self.copy_button, QDialogButtonBox.ButtonRole.ActionRole)
        self.copy_button.clicked.connect(self.copy_diagnostics)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(20, 16, 20, 16)
        layout.setSpacing(10)
        layout.addWidget(title)
        layout.addWidget(blurb)
        layout.addLayout(form)
        layout.addWidget(self.copied)
        layout.addWidget(buttons)

    def text(self) -> str:
        return diagnostics_text(self.facts)

    def copy_diagnostics(self) -> None:
        QGuiApplication.clipboard().setText(self.text())
        self.copied.setText("Copied to the clipboard.")
