"""The window's menu bar: File, Conversation, View, Settings, Help. Actions only; the window connects them."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QMainWindow

THEMES = (("system", "Same as the System"), ("light", "Light"), ("dark", "Dark"))


@dataclass(frozen=True)
class WindowActions:
    """Every menu action, so the window (and tests) can reach them by name."""

    get_model: QAction
    export_profile: QAction
    save_conversation: QAction
    open_log_folder: QAction
    quit: QAction
    new_conversation: QAction
    history: QAction
    stop_speaking: QAction
    mute: QAction
    show_overlay: QAction
    themes: dict[str, QAction]
    theme_group: QActionGroup
    settings: QAction
    about: QAction


def build_menus(window: QMainWindow) -> WindowActions:
    """Create the menus on ``window``'s menu bar and return their actions (not yet connected)."""
    bar = window.menuBar()

    file_menu = bar.addMenu("&File")
    get_model = file_menu.addAction("&Get a Model…")
    get_model.setStatusTip("Download a checkpoint, choose a folder, or start the demo")
    file_menu.addSeparator()
    export_profile = file_menu.addAction("&Export Profile…")
    export_profile.setShortcut(QKeySequence("Ctrl+E"))
    export_profile.setStatusTip("Write the session's frame timings as JSON, CSV and a Chrome trace")
    save_conversation = file_menu.addAction("&Save Conversation…")
    save_conversation.setShortcut(QKeySequence.StandardKey.Save)
    save_conversation.setStatusTip("Save both sides of the conversation as WAV files and a transcript")
    file_menu.addSeparator()
    open_log_folder = file_menu.addAction("Open &Log Folder")
    file_menu.addSeparator()
    quit_action = file_menu.addAction("&Quit")
    quit_action.setShortcut(QKeySequence.StandardKey.Quit)
    quit_action.setMenuRole(QAction.MenuRole.QuitRole)

    conversation_menu = bar.addMenu("&Conversation")
    new_conversation = conversation_menu.addAction("&New Conversation")
    new_conversation.setShortcut(QKeySequence.StandardKey.New)
    new_conversation.setStatusTip("Start again (this conversation is kept in the history)")
    history = conversation_menu.addAction("&History…")
    history.setShortcut(QKeySequence("Ctrl+H"))
    history.setStatusTip("Past conversations: read, replay, export")
    conversation_menu.addSeparator()
    stop_speaking = conversation_menu.addAction("&Stop Speaking")
    stop_speaking.setShortcut(QKeySequence(Qt.Key.Key_Escape))
    stop_speaking.setStatusTip("Drop what the assistant was about to say; it speaks again after your next turn")
    mute = conversation_menu.addAction("&Mute the Assistant")
    mute.setCheckable(True)
    mute.setShortcut(QKeySequence("Ctrl+M"))

    view_menu = bar.addMenu("&View")
    show_overlay = view_menu.addAction("Frame-Time &Overlay")
    show_overlay.setCheckable(True)
    show_overlay.setShortcut(QKeySequence("Ctrl+Shift+O"))
    theme_menu = view_menu.addMenu("&Theme")
    theme_group = QActionGroup(window)
    theme_group.setExclusive(True)
    themes: dict[str, QAction] = {}
    for key, label in THEMES:
        action = theme_menu.addAction(label)
        action.setCheckable(True)
        action.setData(key)
        theme_group.addAction(action)
        themes[key] = action

    settings_menu = bar.addMenu("&Settings")
    settings = settings_menu.addAction("&Settings…")
    settings.setShortcut(QKeySequence("Ctrl+,"))
    settings.setMenuRole(QAction.MenuRole.PreferencesRole)

    help_menu = bar.addMenu("&Help")
    about = help_menu.addAction("&About Parley")
    about.setMenuRole(QAction.MenuRole.AboutRole)

    return WindowActions(
        get_model=get_model,
        export_profile=export_profile,
        save_conversation=save_conversation,
        open_log_folder=open_log_folder,
        quit=quit_action,
        new_conversation=new_conversation,
        history=history,
        stop_speaking=stop_speaking,
        mute=mute,
        show_overlay=show_overlay,
        themes=themes,
        theme_group=theme_group,
        settings=settings,
        about=about,
    )
