"""Remediation (opt-in): restart the server with the fallback that avoids the cause, verified.

`factory.make_remediation_hook` is the entry point the wiring calls; `plan` chooses the fallback,
`state` persists counters and the active fallback, `restarters` act per deployment shape,
`verify` decides recovered / not_recovered, `canary` probes an idle server;
`hang-watchdog fallback show|clear` is watchdog/commands/fallback.py.
"""
