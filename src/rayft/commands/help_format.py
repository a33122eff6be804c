"""The help screens' format: flags (``--dry-run``, ``--help``, ``--wait/--no-wait``) take no
value, so their type column stays empty instead of typer's ``<bool>``."""

from __future__ import annotations

from typer.core import TyperOption


def hide_flag_types() -> None:
    """Make typer's rich help show no type for flag options (idempotent). typer (0.29) labels every
    option with its Python type, flags included, which reads as if ``--help`` took a value. A no-op
    on older typers (< ~0.28), which have no ``display_type_rich`` and leave flags' type out already."""
    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None:
        return
    if getattr(shown, "rayft_flags_hidden", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag else shown(self, ctx)

    display_type_rich.rayft_flags_hidden = True
    TyperOption.display_type_rich = display_type_rich
