from django.urls import path

from . import views

app_name = "relay"
urlpatterns = [
    path("callbacks", views.callback, name="callbacks"),
    path("status", views.status, name="status"),
]
