"""The one error type for user mistakes: the CLI prints its message, without a traceback, and exits 2."""


class UserError(ValueError):
    """Something the user gave (recipe, data, model name, reward) that cannot be used; the message says what to fix."""
