"""Remediation (opt-in): restart the server with the fallback that avoids the cause, verified.

`factory.make_remediation_hook` and `factory.make_canary` are the entry points the wiring
calls; `decide` is the pure rule chain, `machine` the hook's phases, `plan` chooses the
fallback, `state` persists counters and the active fallback, `restarters` act per deployment
shape, `verify` decides recovered / not_recovered, `canary` probes an idle server. Nothing here
imports daemon/ or outputs/: what the hook needs from them comes in through `collaborators`.
`hang-watchdog fallback show|clear` is watchdog/commands/fallback.py.
"""
