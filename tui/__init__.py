"""The Textual dashboard (`gpuchef top`)."""
