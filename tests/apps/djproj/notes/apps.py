from django.apps import AppConfig


class NotesConfig(AppConfig):
    name = "apps.djproj.notes"
    label = "notes"
