"""Remediation (opt-in): restart the server with the fallback that avoids the cause, verified.

`factory.make_remediation_hook` is the entry point the wiring calls, with `settings`'
RemediationConfig (the config keys remediation reads, frozen); `decide` is the pure rule
chain, `machine` the hook's phases, `plan` chooses the fallback, `state` persists counters and
the active fallback, `restarters` act per deployment shape, `verify` decides recovered /
not_recovered. The idle canary is a source (sources/canary.py). Nothing here imports daemon/
or outputs/: what the hook needs from them comes in through `collaborators`.
`hang-watchdog fallback show|clear` is watchdog/commands/fallback.py.
"""
