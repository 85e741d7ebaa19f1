from django.apps import AppConfig


class RelayConfig(AppConfig):
    name = "relay_client.django"
    label = "relay"
    verbose_name = "Relay"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import (
            catalogue,
            checks,  # noqa: F401  (registers the system checks)
            conf,
        )

        # The catalogue ahead of the first request, on a thread (never inside a request).
        relay = conf.settings_or_none()
        if relay and relay.get("URL") and relay.get("API_KEY") and conf.get("VALIDATE"):
            catalogue.prefetch()
