"""Pure decision functions over frozen dataclasses (one concept per module); callers apply them."""
