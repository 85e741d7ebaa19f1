"""The shop's work still on django-q2 (not moved yet): plain functions django-q2 runs by their
dotted path (``async_task("shop.legacy.tally_orders")``)."""


def tally_orders() -> dict:
    from .models import Order

    return {"orders": Order.objects.count()}


def broken() -> None:
    raise ValueError("this legacy task always fails")
