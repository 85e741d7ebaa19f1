from django.db import models


class Order(models.Model):
    email = models.EmailField()
    total_cents = models.IntegerField()
    #: The Relay job confirming the order (the outbox row's id, which is also the task result id).
    confirmation = models.UUIDField(null=True)
    #: Set once from ``job_finished`` (``shop.receivers``): the job's terminal status and when it was learned.
    confirmation_status = models.CharField(max_length=20, blank=True, default="")
    confirmation_finished_at = models.DateTimeField(null=True, blank=True)
