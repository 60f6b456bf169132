from typing import ClassVar

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[migrations.CreateModel]] = [
        migrations.CreateModel(
            name="Note",
            fields=[
                ("id", models.AutoField(auto_created=True, primary_key=True, serialize=False,
                                        verbose_name="ID")),
                ("text", models.CharField(max_length=200)),
                ("pid", models.IntegerField()),
            ],
            options={"db_table": "worker_celery_djproj_note"},
        ),
    ]
