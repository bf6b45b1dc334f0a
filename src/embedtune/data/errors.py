"""The error raised for bad input files: it names the file, the line, the field and the fix."""

from __future__ import annotations

from embedtune.errors import EmbedtuneError

__all__ = ["DataFormatError"]


class DataFormatError(EmbedtuneError):
    def __init__(self, file: str, problem: str, fix: str, line: int | None = None, field: str | None = None) -> None:
        where = f"{file}:{line}" if line is not None else str(file)
        field_part = f" field {field!r}:" if field else ""
        super().__init__(f"{where}:{field_part} {problem}. Fix: {fix}")
        self.file, self.line, self.field, self.problem, self.fix = file, line, field, problem, fix
