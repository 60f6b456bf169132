"""Task modules the tests run real workers with."""
