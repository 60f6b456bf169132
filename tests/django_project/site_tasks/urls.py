from django.urls import path

from . import views

urlpatterns = [
    path("add/", views.add),
    path("add-and-wait/", views.add_and_wait),
    path("order/", views.order),
]
