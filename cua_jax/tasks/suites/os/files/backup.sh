#!/bin/bash
# Copies the Documents folder to /tmp/backup.
cp -r "$HOME/Documents" /tmp/backup
