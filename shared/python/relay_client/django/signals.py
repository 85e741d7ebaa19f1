"""Signals for what Relay said about an outbox row after the commit, where no request sees it.

``job_refused`` and ``job_blocked`` are sent with ``sender=RelayJob`` and keyword arguments
``row`` (the ``RelayJob``) and ``error`` (the ``RelayError``). Connect a receiver to alert, or
to show the row to a person. ``job_finished`` tells the project a job ended.
"""

from django.dispatch import Signal

#: Relay refused the row for good (400/413/422, e.g. a check its published schema does not
#: carry): the row is closed as ``refused``.
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

#: A job reached a terminal status: ``succeeded``, ``failed``, ``cancelled`` (Relay's), or
#: ``refused`` (Relay never took the request). Sent with ``sender=RelayJob``, ``row`` (the
#: ``RelayJob``, as just written) and ``status``, after the commit that wrote it, once per
#: terminal status the row enters, whichever way it arrived: a signed callback, ``relay_reconcile``
#: (or ``relay_worker``), ``refresh()``/``result.refresh()``, or the answer to the post. A job an
#: operator retries after it failed can end again (``failed``, then ``succeeded``): one signal
#: each. Receivers run in the process that learned it (the web process for a callback); keep them
#: short and idempotent, e.g. one conditional UPDATE of the domain object.
job_finished = Signal()
