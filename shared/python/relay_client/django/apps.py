from django.apps import AppConfig


class RelayConfig(AppConfig):
    name = "relay_client.django"
    label = "relay"
    verbose_name = "Relay"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
