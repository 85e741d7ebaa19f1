"""Signals for what Relay said about an outbox row after the commit, where no request sees it.

Both are sent with ``sender=RelayJob`` and keyword arguments ``row`` (the ``RelayJob``) and
``error`` (the ``RelayError``). Connect a receiver to alert, or to show the row to a person.
"""

from django.dispatch import Signal

#: Relay refused the row for good (400/413/422, e.g. an email address only Relay checks): the
#: row is closed as ``refused``.
job_refused = Signal()
#: Relay will not take the row until the tenant changes something: 409 (a destination or
#: template it has not stored: status ``blocked``, posted again on demand) or 401/403 (the key:
#: the row stays unsent and the drain keeps offering it). ``relay_drain`` exits non-zero.
job_blocked = Signal()

#: An event on a message sent through Relay reached this project for the first time (a signed
#: callback, or ``replay_message_events``): sent after the commit that kept it, with
#: ``sender=RelayMessageEvent`` and ``event`` (the row). ``event.type`` is ``message.bounced``,
#: ``message.complained``, ``message.suppressed``... (the types the tenant's callbacks subscribe
#: to). Connect a receiver to act on it, e.g. stop mailing a user whose address bounced.
message_event = Signal()
