"""Result backends: the stored format, and the embedded and disabled backends."""
