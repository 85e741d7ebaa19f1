"""A small shop that sends its order confirmations through Relay and tallies orders locally.

Everything comes from the environment: DATABASE_URL (Postgres), RELAY_URL, RELAY_API_KEY,
RELAY_SIGNING_SECRETS (space-separated), RELAY_STATUS_KEY.
"""

import os
from importlib.util import find_spec
from urllib.parse import urlparse

_db = urlparse(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/relay_example"))

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True
TIME_ZONE = "UTC"  # RELAY["SCHEDULES"] crons are read in this zone
ROOT_URLCONF = "example.urls"
STATIC_URL = "static/"  # the test live server wraps the app in a static-files handler that needs it
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_tasks_db",
    "django_q",  # the work not moved yet (django-q2), beside django.tasks during the move
    "relay_client.django",
    "shop",
]
if find_spec("django.tasks") is None:  # Django 5.2 LTS: django.tasks comes from the backport
    INSTALLED_APPS.insert(INSTALLED_APPS.index("django_tasks_db"), "django_tasks")

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("DJANGO_DB_NAME", _db.path.lstrip("/")),
        "USER": _db.username or "postgres",
        "PASSWORD": _db.password or "",
        "HOST": _db.hostname or "127.0.0.1",
        "PORT": _db.port or 5432,
        "TEST": {"NAME": os.environ.get("DJANGO_TEST_DB_NAME")},
    }
}

TASKS = {
    # Local work (the residue that cannot move): django-tasks-db on this project's database, with
    # attempts and backoff (run by `manage.py relay_tasks_worker`).
    "default": {"BACKEND": "relay_client.django.local.LocalBackend"},
    # Platform work: Relay's task types.
    "relay": {"BACKEND": "relay_client.django.backend.RelayBackend"},
}

# django-q2 as AI Shipping Labs runs it: the ORM broker on the project's database, heartbeats in a
# database cache every process reads (the status view shows the clusters from there).
Q_CLUSTER = {
    "name": "shop",
    "orm": "default",
    "cache": "django_q",
    "workers": 1,
    "timeout": 30,
    "retry": 60,
    "max_attempts": 2,  # a failed attempt's row stays queued, retried once its claim lapses
    "poll": 0.2,
    "catch_up": False,
}
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "django_q": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "django_q_cache"},
}

RELAY = {
    "URL": os.environ.get("RELAY_URL", "http://127.0.0.1:8080"),
    "API_KEY": os.environ.get("RELAY_API_KEY", ""),
    "SIGNING_SECRETS": os.environ.get("RELAY_SIGNING_SECRETS", "").split(),
    "STATUS_KEYS": [k for k in [os.environ.get("RELAY_STATUS_KEY")] if k],
    "PROJECT": "shop",
    # Local tasks: one attempt unless a task or a call asks for more.
    "TASK_ATTEMPTS": 1,
    "TASK_BACKOFF": 60,
    # Workers beat every HEARTBEAT_SECONDS; one silent for WORKER_STALE_SECONDS is dead.
    "HEARTBEAT_SECONDS": float(os.environ.get("RELAY_HEARTBEAT_SECONDS", "10")),
    "WORKER_STALE_SECONDS": float(os.environ.get("RELAY_WORKER_STALE_SECONDS", "60")),
    "WORKERS": ["relay_worker", "relay_tasks_worker"],
    # Local periodic work, fired by `manage.py relay_worker` (each slot once across workers).
    "SCHEDULES": [
        {"name": "nightly-tally", "cron": "0 2 * * *", "task": "shop.tasks.tally_orders"},
        {"name": "minutely-tally", "cron": "* * * * *", "task": "shop.tasks.tally_orders"},
    ],
}

LOGGING = {
    "version": 1,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "relay_client": {"handlers": ["console"], "level": "WARNING"},
        "django.request": {"handlers": ["console"], "level": "ERROR"},
    },
}
