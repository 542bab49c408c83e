"""The one error type the command line turns into a one-line message and exit status 2."""


class MoecacheError(Exception):
    """Bad input or settings; the message is one line that names the problem."""


def first_line(error: BaseException) -> str:
    """The first line of a library's (often multi-line) error message."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
