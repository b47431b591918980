"""A prompt's deliveries entry: the workers it was delivered to, oldest first, one name a line.

A delivery taken back (`take_back`: it ended without its worker dying) leaves
its mark: a first line `#<n>`, how many were (a worker's name is a Celery node
name, `gen@host` as deployed, never so). So an entry changes every time its
prompt is noted or given back, and the audit, which reads the entry of a
prompt it finds missing, tells a prompt that a live worker keeps taking and
giving back (missing for moments at each turn) from one whose message is lost
(its entry stays as it was: `workers/intake/audit.py`, `Suspects`). The mark
goes with the entry when the prompt finishes (`clear`).

`workers/intake/deliveries.py` keeps these entries (the poison-prompt rule), and
`Ledger.intake` notes a delivery in the same script that reads the prompt's
ids; both read and change an entry through the Lua functions here, and Python
reads one with `names`, so the format has this one home.
"""
from __future__ import annotations

from contract.redis_link.scripts import lua_string

SEPARATOR = "\n"
GIVEN_BACK = "#"  # the first character of the line that counts the deliveries taken back

# The Lua functions every script that touches an entry shares. `hash`: the run's deliveries hash.
LUA = f"""
local DELIVERY_SEP, GIVEN_BACK = {lua_string(SEPARATOR)}, {lua_string(GIVEN_BACK)}
local function delivered(entry)  -- the names in an entry (false or nil: none), its mark left out
  local names = {{}}
  if entry then for name in string.gmatch(entry, '[^' .. DELIVERY_SEP .. ']+') do
    if string.sub(name, 1, 1) ~= GIVEN_BACK then names[#names + 1] = name end
  end end
  return names
end
local function deliver(hash, id, entry, worker)  -- the entry `entry` with `worker` last; returns it
  local held = entry and (entry .. DELIVERY_SEP .. worker) or worker
  redis.call('HSET', hash, id, held)
  return held
end
-- the entry without `worker`'s latest line, its count of deliveries taken back one up; returns how many are left
local function take_back(hash, id, worker)
  local entry = redis.call('HGET', hash, id)
  local names = delivered(entry)
  for i = #names, 1, -1 do
    if names[i] == worker then
      table.remove(names, i)
      local taken = tonumber(string.match(entry, '^' .. GIVEN_BACK .. '(%d+)') or 0)
      table.insert(names, 1, GIVEN_BACK .. (taken + 1))
      redis.call('HSET', hash, id, table.concat(names, DELIVERY_SEP))
      return #names - 1
    end
  end
  return #names  -- not noted for `worker` (a finished prompt's entry is gone): nothing to take back
end
"""


def names(raw: bytes | str | None) -> list[str]:
    """The workers named in an entry, oldest first (none for an absent entry), its mark left out."""
    return [name for name in as_text(raw).split(SEPARATOR) if name and not name.startswith(GIVEN_BACK)]


def as_text(raw: bytes | str | None) -> str:
    """An entry as read from Redis, as text ("" for an absent one)."""
    if not raw:
        return ""
    return raw.decode() if isinstance(raw, bytes) else raw
