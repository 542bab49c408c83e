"""Typed records of what the stages exchange, and the files that carry them: frozen,
versioned dataclasses, read and written only through their modules here. No torch."""
