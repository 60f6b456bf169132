from django.db import models


class Note(models.Model):
    text = models.CharField(max_length=200)
    pid = models.IntegerField()

    class Meta:
        db_table = "worker_celery_djproj_note"
