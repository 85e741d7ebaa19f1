from django.contrib import admin
from django.urls import include, path

from shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders", views.place_order),
    path("enqueue-many", views.enqueue_many),
    path("orders/<uuid:job_id>/refresh", views.refresh_confirmation),
    path("relay/", include("relay_client.django.urls")),
]
