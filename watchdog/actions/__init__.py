"""Things that fire on a verdict: incident bundles (incident.py) and remediation."""
