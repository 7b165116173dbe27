"""Test helper: hold a decode after its n-th text increment until it is cancelled, so a cancellation
always arrives mid-decode however fast the decoder is (an event, not a sleep that hopes the other
side is quicker)."""
import contextlib


@contextlib.contextmanager
def held_after_text(llm, n: int = 1, only=None):
    """While open: each ``llm.generate`` (``only()`` true, when given) stops after its ``n``-th text
    increment and waits (up to 30 s) for its ``cancel`` event. The instance attribute shadows the
    class's method and is removed on exit."""
    real = llm.generate

    def generate(*args, on_text=None, cancel=None, **kw):
        if only is not None and not only():
            return real(*args, on_text=on_text, cancel=cancel, **kw)
        seen = [0]

        def hold(delta):
            out = on_text(delta) if on_text is not None else None
            seen[0] += 1
            if seen[0] == n and cancel is not None:
                cancel.wait(30)
            return out

        return real(*args, on_text=hold, cancel=cancel, **kw)

    llm.generate = generate
    try:
        yield
    finally:
        del llm.generate  # back to the class's method
