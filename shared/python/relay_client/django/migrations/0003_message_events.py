from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("relay", "0002_outbox_keys_options_schedules"),
    ]

    operations = [
        migrations.CreateModel(
            name="RelayMessageEvent",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("event_id", models.BigIntegerField(unique=True)),
                ("type", models.CharField(max_length=40)),
                ("message_id", models.UUIDField()),
                ("job_id", models.UUIDField()),
                ("correlation_id", models.CharField(max_length=200)),
                ("recipients", models.JSONField(default=list)),
                ("occurred_at", models.DateTimeField(blank=True, null=True)),
                ("received_at", models.DateTimeField()),
                ("bounce_type", models.CharField(blank=True, default="", max_length=40)),
                ("bounce_subtype", models.CharField(blank=True, default="", max_length=60)),
                ("complaint_type", models.CharField(blank=True, default="", max_length=60)),
                ("note", models.TextField(blank=True, default="")),
            ],
            options={
                "indexes": [models.Index(fields=["message_id"], name="relay_message_event_idx")],
            },
        ),
    ]
