"""Which model loads: checking a folder before anything is unloaded, switching, adopting, falling back.

Qt-free; the controller's collaborator, run on its (UI) thread. A folder that is not a VoiceChat checkpoint,
or holds another variant than its slot, is refused (``app.model_check``) and the loaded model and the settings
stay. At launch a refused folder falls back to another configured model that passes (or the demo), and
``ModelFallback`` says so. When the worker reloads the previous model because the one asked for failed after its
checks, the active-model setting goes back with it (:meth:`ModelSwitcher.came_back`).

The settings stay the controller's: they are read through ``settings()`` and changed through ``keep_settings``
(which also saves them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from .messages import Failure, ModelFallback, ModelLoaded
from .model_check import CheckedCheckpoint, CheckpointRefused, check_checkpoint
from .settings import Settings
from .status import StatusBoard
from .variants import MODEL_VARIANTS, variant
from .worker import EngineWorker, Load, LoadDemo

log = logging.getLogger(__name__)


class AdoptCheckpoint:
    """Internal: a finished download to adopt (handled in the controller's ``poll``)."""

    def __init__(self, variant: str, path: Path) -> None:
        self.variant = variant
        self.path = path


class ModelSwitcher:
    """Turns "use this model" into a checked ``Load`` for the worker, or a one-line refusal."""

    def __init__(
        self,
        worker: EngineWorker,
        board: StatusBoard,
        post: Callable[[object], None],
        settings: Callable[[], Settings],
        keep_settings: Callable[[Settings], None],
        *,
        auto_demo: bool,
    ) -> None:
        self._worker = worker
        self._board = board
        self._post = post
        self._settings = settings
        self._keep_settings = keep_settings
        self._auto_demo = auto_demo
        self._requested: Path | None = None  # the folder of the load asked for last (None: the demo)

    def load_configured(self) -> None:
        """At launch: the active model if its folder passes the checks, else another configured one, else the demo."""
        settings = self._settings()
        active = settings.active_variant
        path = settings.active_checkpoint
        if active is None or path is None:
            self._no_model()
            return
        try:
            self.load(check_checkpoint(path, active))
            return
        except CheckpointRefused as exc:
            reason = f"The {variant(active).label} folder cannot be used: {exc}"
        log.warning("%s", reason)
        for other in MODEL_VARIANTS:
            folder = settings.checkpoint_for(other.key)
            if other.key == active or folder is None:
                continue
            try:
                checked = check_checkpoint(folder, other.key)
            except CheckpointRefused as exc:
                log.warning("The %s folder cannot be used either: %s", other.label, exc)
                continue
            self._post(ModelFallback(f"{reason} The {other.label} model loads instead (Settings → Model)."))
            self.load(checked)
            return
        if self._auto_demo:
            self._post(ModelFallback(f"{reason} The demo loads instead (File → Get a Model… for a model)."))
        else:
            self._post(Failure(reason))
        self._no_model()

    def _no_model(self) -> None:
        if self._auto_demo:
            # Loaded, not started: "Try the demo" (or the talk key) starts it at once, and nothing plays before.
            self.start_demo()

    def switch_variant(self, key: str) -> None:
        """Load the configured ``key`` model once its folder passes the checks; refused, nothing changes."""
        chosen = variant(key)
        path = self._settings().checkpoint_for(key)
        if path is None:
            self._post(Failure(f"No {chosen.label} checkpoint folder is configured; choose one in Settings."))
            return
        try:
            checked = check_checkpoint(path, key)
        except CheckpointRefused as exc:
            self._refused(f"Not switched to {chosen.label}: {exc}")
            return
        log.info("Switching to the %s model in %s", chosen.label, path)
        self._keep_settings(self._settings().with_changes(active_variant=key))
        self.load(checked)

    def use_checkpoint(self, path: Path) -> None:
        """Adopt a local checkpoint folder, stored as the variant its tensors' quantization makes it."""
        try:
            checked = check_checkpoint(Path(path))
        except CheckpointRefused as exc:
            self._refused(f"Not used: {exc}")
            return
        chosen = checked.variant
        log.info("Using the %s checkpoint in %s", chosen.label, checked.path)
        self._adopt_checked(checked, chosen.key)

    def adopt(self, finished: AdoptCheckpoint) -> None:
        log.info("Downloaded the %s model to %s", finished.variant, finished.path)
        try:
            checked = check_checkpoint(finished.path, finished.variant)
        except CheckpointRefused as exc:
            self._refused(f"The downloaded {variant(finished.variant).label} model cannot be used: {exc}")
            return
        self._adopt_checked(checked, finished.variant, finished.path)

    def _adopt_checked(self, checked: CheckedCheckpoint, key: str, folder: Path | None = None) -> None:
        """File ``checked`` in the ``key`` slot (as ``folder``, or its own path), make it active, save, load it."""
        settings = self._settings().with_checkpoint(key, folder if folder is not None else checked.path)
        self._keep_settings(settings.with_changes(active_variant=key))
        self.load(checked)

    def came_back(self, loaded: ModelLoaded) -> None:
        """The worker reloaded the previous model because the one asked for failed after its checks: the active
        model setting goes back with it (the worker's ModelFallback said why)."""
        requested, self._requested = self._requested, None
        if requested is None or loaded.path == requested or loaded.variant.demo:
            return
        key = loaded.variant.key
        settings = self._settings()
        if settings.checkpoint_for(key) == loaded.path and settings.active_variant != key:
            self._keep_settings(settings.with_changes(active_variant=key))

    def _refused(self, message: str) -> None:
        """A folder failed its checks before anything was unloaded: say so in one line; what is loaded stays."""
        loaded = self._board.model
        message = message.rstrip(".") + "."
        if loaded is not None:
            named = "The demo" if loaded.variant.demo else f"{loaded.name} ({loaded.variant.label})"
            message += f" {named} stays loaded."
        log.warning("%s", message)
        self._post(Failure(message))

    def start_demo(self) -> None:
        self._requested = None
        settings = self._settings()
        self._worker.submit(LoadDemo(settings.system_prompt, numerics=settings.numerics))

    def load(self, checked: CheckedCheckpoint) -> None:
        settings = self._settings()
        self._requested = checked.path
        self._worker.submit(
            Load(
                checked.path,
                demo=checked.demo,
                system_prompt=settings.system_prompt,
                numerics=settings.numerics,
                random_weights=checked.random_weights,
            )
        )


def check_changed_folders(old: Settings, new: Settings) -> dict[str, CheckedCheckpoint]:
    """Check each model folder that changed, and the active one if the active model changes; by variant key.

    Raises:
        CheckpointRefused: the first that cannot be used, in words that name the slot.
    """
    checked: dict[str, CheckedCheckpoint] = {}
    switching = new.active_checkpoint != old.active_checkpoint or new.active_variant != old.active_variant
    for offered in MODEL_VARIANTS:
        folder = new.checkpoint_for(offered.key)
        if folder is None:
            continue
        if folder == old.checkpoint_for(offered.key) and not (switching and offered.key == new.active_variant):
            continue
        try:
            checked[offered.key] = check_checkpoint(folder, offered.key)
        except CheckpointRefused as exc:
            raise CheckpointRefused(f"The {offered.label} folder cannot be used: {exc}") from None
    return checked
