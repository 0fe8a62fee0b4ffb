"""OS-domain tasks (OSWorld JSON) for the osworld image: terminal, files and settings, with scripted solutions."""
