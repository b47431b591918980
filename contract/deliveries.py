"""A prompt's deliveries entry: the workers it was delivered to, oldest first, one name a line.

`workers/intake/deliveries.py` keeps these entries (the poison-prompt rule), and
`Ledger.intake` notes a delivery in the same script that reads the prompt's
ids; both read and change an entry through the Lua functions here, and Python
reads one with `names`, so the format has this one home.
"""
from __future__ import annotations

from .scripts import lua_string

SEPARATOR = "\n"

# The Lua functions every script that touches an entry shares. `hash`: the run's deliveries hash.
LUA = f"""
local DELIVERY_SEP = {lua_string(SEPARATOR)}
local function delivered(entry)  -- the names in an entry (false or nil: none)
  local names = {{}}
  if entry then for name in string.gmatch(entry, '[^' .. DELIVERY_SEP .. ']+') do names[#names + 1] = name end end
  return names
end
local function deliver(hash, id, entry, worker)  -- the entry `entry` with `worker` last; returns it
  local held = entry and (entry .. DELIVERY_SEP .. worker) or worker
  redis.call('HSET', hash, id, held)
  return held
end
local function take_back(hash, id, worker)  -- the entry without `worker`'s latest line; returns how many are left
  local names = delivered(redis.call('HGET', hash, id))
  for i = #names, 1, -1 do
    if names[i] == worker then table.remove(names, i) break end
  end
  if #names == 0 then redis.call('HDEL', hash, id)
  else redis.call('HSET', hash, id, table.concat(names, DELIVERY_SEP)) end
  return #names
end
"""


def names(raw: bytes | str | None) -> list[str]:
    """The workers named in an entry, oldest first (none for an absent entry)."""
    if not raw:
        return []
    text = raw.decode() if isinstance(raw, bytes) else raw
    return [name for name in text.split(SEPARATOR) if name]
