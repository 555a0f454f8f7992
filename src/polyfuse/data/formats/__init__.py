"""Importers of public dataset layouts (one module per format)."""
