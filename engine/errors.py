"""Errors the engine raises, each with a message fit to show a user as-is."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class CheckpointError(EngineError, ValueError):
    """A checkpoint folder cannot be used; the message names the file and tensor."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The folder, or a file the checkpoint needs, does not exist."""


class ConfigError(CheckpointError):
    """``config.json`` is missing, unreadable, or describes another model."""


class ShardError(CheckpointError):
    """A weight shard is missing, truncated or corrupt."""


class TensorMismatchError(CheckpointError):
    """Tensors are missing, unexpected, or of the wrong shape or dtype."""


class TokenizerError(CheckpointError):
    """The tokenizer is missing, unreadable, or does not fit the model."""


class CheckpointMemoryError(CheckpointError, MemoryError):
    """The machine does not have the memory to hold the checkpoint."""


class AudioInputError(EngineError, ValueError):
    """Audio pushed into a session is not what the model accepts."""


class SessionClosedError(EngineError, RuntimeError):
    """The session was flushed, cancelled or closed and takes no more input."""


class ContextLimitError(EngineError, RuntimeError):
    """The conversation reached the session's length limit."""


class ToolPromptError(EngineError, ValueError):
    """The tools offered to the model cannot be written into its prompt (too many, not ASCII, a bad name)."""


class ToolLoopError(EngineError, RuntimeError):
    """Tool results were given to a session that is not waiting for them, or not one per pending call."""
