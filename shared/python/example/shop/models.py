from django.db import models


class Order(models.Model):
    email = models.EmailField()
    total_cents = models.IntegerField()
    #: The Relay job confirming the order (the outbox row's id, which is also the task result id).
    confirmation = models.UUIDField(null=True)
