"""Lua scripts that make every Redis write of the session store atomic.

All session scripts take the seven keys of one session (one hash tag, so they run on one
Cluster shard): meta, chain, msgs, blobs, gw, state, counts. Each checks everything before
its first write, so an error reply never leaves a partial write behind.

meta (hash): nb (branch count), head, bytes, and per branch b: p<b> parent, f<b> fork
index, l<b> history length. chain / msgs (hash): "<b>:<i>" -> chained digest / packed
message at history index i, for a branch's own messages only. blobs: digest -> blob.
gw: "<b>:n" count, "<b>:<seq>" -> packed [after_index, message]. state: the request log,
"<b>:rn" count, "<b>:r:<seq>" records (the key's name predates the log).
counts: "<b>:<name>" -> integer, "t:<token>" for every counting call already applied.
Tenant scripts take keys under the tenant's own tag: its counters, token keys, quota
counters, lease pools and session index.
"""

_COMMON = """
local meta, chainkey, msgs, blobs, gw, st = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local cnt = KEYS[7]
local function touch(ttl)
  for i = 1, 7 do redis.call('PEXPIRE', KEYS[i], ttl) end
end
-- (digest, body) pairs in ARGV from index ``first`` that the session does not hold yet,
-- and the bytes they add (body + 16-byte digest each).
local function new_blobs(first)
  local found, size = {}, 0
  for j = first, #ARGV, 2 do
    local d = ARGV[j]
    if found[d] == nil and redis.call('HEXISTS', blobs, d) == 0 then
      found[d] = ARGV[j + 1]
      size = size + #ARGV[j + 1] + 16
    end
  end
  return found, size
end
"""

# Where a sent history lands (``chains``: its chained digests, 16 bytes each): sets
# ``target`` (a branch it extends or repeats; -1: a new branch), ``from`` (how many of its
# messages are stored) and ``parent`` (a new branch's; -1: a new session); the session's
# meta fields in ``h`` and the branch table in par/fork/len.
_SELECT = """
local n = #chains / 16
local function c(i) return string.sub(chains, i * 16 + 1, i * 16 + 16) end

local flat = redis.call('HGETALL', meta)
local h = {}
for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
local nb, head = tonumber(h['nb'] or '0'), tonumber(h['head'] or '-1')
local par, fork, len = {}, {}, {}
for b = 0, nb - 1 do
  par[b], fork[b], len[b] = tonumber(h['p' .. b]), tonumber(h['f' .. b]), tonumber(h['l' .. b])
end
local function chain_at(b, p)
  while p < fork[b] do b = par[b] end
  return redis.call('HGET', chainkey, b .. ':' .. p)
end

-- the longest branch whose history is a prefix of the request (ties: the head)
local target, from, parent = -1, 0, -1
for b = 0, nb - 1 do
  local L = len[b]
  local better = L > from or (L == from and b == head)
  if L <= n and better and chain_at(b, L - 1) == c(L - 1) then target, from = b, L end
end
if target < 0 then
  -- diverged: fork from the branch sharing the longest common prefix (binary search,
  -- since a matching chained digest at p implies every earlier one matches)
  for b = 0, nb - 1 do
    local lo, hi = 0, math.min(len[b], n)
    while lo < hi do
      local mid = math.floor((lo + hi + 1) / 2)
      if chain_at(b, mid - 1) == c(mid - 1) then lo = mid else hi = mid - 1 end
    end
    if lo > from or (lo == from and lo > 0 and b == head) then from, parent = lo, b end
  end
  -- a shorter re-send (a late or retried earlier request): already stored
  if from == n then target, parent = parent, -1 end
end
"""

# KEYS[8]: the session's assignment. ARGV: 1 '1'/'0' (set it), 2 replica, 3 '1'/'0' (has
# expected), 4 expected, 5 ttl_ms. Sets ``asg``: the assignment in force afterwards.
_ASSIGN = """
local asg = false
local function assign()
  if ARGV[1] ~= '1' then return end
  local cur = redis.call('GET', KEYS[8])
  if cur == false or cur == ARGV[2] or (ARGV[3] == '1' and cur == ARGV[4]) then
    redis.call('SET', KEYS[8], ARGV[2], 'PX', ARGV[5])
    asg = ARGV[2]
  else
    asg = cur
  end
end
"""

# KEYS: the session's seven keys, then its assignment. ARGV: the five assignment fields
# (``_ASSIGN``), ttl_ms, max_bytes, chained digests (16 bytes each, one per sent message),
# k (index of the first body sent), m (number of bodies), m bodies, then blob pairs.
# Replies: {'ok', branch, length, appended, new_branch, assignment} | {'need', index} |
# {'too_large', stored, adding}.
INGEST = (
    _COMMON
    + _ASSIGN
    + """
local ttl, maxb, chains = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local k, m = tonumber(ARGV[9]), tonumber(ARGV[10])
"""
    + _SELECT
    + """
local bytes = tonumber(h['bytes'] or '0')
if from == n then
  redis.call('HSET', meta, 'head', target)
  assign()
  touch(ttl)
  return {'ok', target, n, 0, 0, asg}
end
local newb = 0
if target < 0 then newb, target = 1, nb end
if k > from then return {'need', from} end
if m ~= n - k then return redis.error_reply('ingest: expected ' .. (n - k) .. ' bodies') end

local add = 0
for i = from, n - 1 do add = add + #ARGV[11 + i - k] + 16 end
local newblobs, blob_bytes = new_blobs(11 + m)
add = add + blob_bytes
if bytes + add > maxb then return {'too_large', bytes, add} end

if newb == 1 then
  redis.call('HSET', meta, 'p' .. target, parent, 'f' .. target, from, 'nb', nb + 1)
end
redis.call('HSET', meta, 'l' .. target, n, 'head', target, 'bytes', bytes + add)
for i = from, n - 1 do
  redis.call('HSET', chainkey, target .. ':' .. i, c(i))
  redis.call('HSET', msgs, target .. ':' .. i, ARGV[11 + i - k])
end
for d, v in pairs(newblobs) do redis.call('HSET', blobs, d, v) end
assign()
touch(ttl)
return {'ok', target, n, n - from, newb, asg}
"""
)

# KEYS: the session's seven keys, then its assignment. ARGV: the chained digests. Reads
# only. Reply: {branch, stored, parent, assignment, counts (flat name/value pairs of the
# branch), turns (flat limit/envelope pairs: the gateway turns of the branch's ancestry, or
# a new branch's parent's, each with the index below which its message must lie), the
# session's stored bytes (for the size cap)}.
LOOKUP = (
    _COMMON
    + """
local chains = ARGV[1]
"""
    + _SELECT
    + """
local asg = redis.call('GET', KEYS[8])
local owner, limit = target, n
if target < 0 then owner, limit = parent, from end
local counts, turns = {}, {}
if target >= 0 then
  local flat_counts = redis.call('HGETALL', cnt)
  local prefix = target .. ':'
  for i = 1, #flat_counts, 2 do
    local name = flat_counts[i]
    if string.sub(name, 1, #prefix) == prefix then
      counts[#counts + 1] = string.sub(name, #prefix + 1)
      counts[#counts + 1] = flat_counts[i + 1]
    end
  end
end
if owner >= 0 then
  -- the ancestry of ``owner`` (each segment's turns follow messages below its end), read
  -- from the root down so that turns keep their record order
  local segs, b, hi = {}, owner, limit
  while b >= 0 do
    segs[#segs + 1] = {b, hi}
    b, hi = par[b], math.min(fork[b], hi)
  end
  for j = #segs, 1, -1 do
    local s, end_ = segs[j][1], segs[j][2]
    local count = tonumber(redis.call('HGET', gw, s .. ':n') or '0')
    for i = 0, count - 1 do
      turns[#turns + 1] = end_
      turns[#turns + 1] = redis.call('HGET', gw, s .. ':' .. i)
    end
  end
end
return {target, from, parent, asg, counts, turns, tonumber(h['bytes'] or '0')}
"""
)

# ARGV: ttl_ms, max_bytes, branch, after_index, token, m, m packed envelopes, blob pairs.
# The token makes a retried call (reply lost, connection dropped) a no-op.
# Replies: {'ok'} | {'no_branch'} | {'bad_index', length} | {'too_large', stored, adding}.
GATEWAY_TURNS = (
    _COMMON
    + """
local ttl, maxb, b, after = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local token, m = b .. ':t:' .. ARGV[5], tonumber(ARGV[6])
if redis.call('HEXISTS', gw, token) == 1 then return {'ok'} end
local l = redis.call('HGET', meta, 'l' .. b)
if not l then return {'no_branch'} end
if after >= tonumber(l) then return {'bad_index', tonumber(l)} end
local bytes = tonumber(redis.call('HGET', meta, 'bytes') or '0')
local add = 0
for i = 1, m do add = add + #ARGV[6 + i] end
local newblobs, blob_bytes = new_blobs(7 + m)
add = add + blob_bytes
if bytes + add > maxb then return {'too_large', bytes, add} end
local seq = redis.call('HINCRBY', gw, b .. ':n', m) - m
for i = 1, m do redis.call('HSET', gw, b .. ':' .. (seq + i - 1), ARGV[6 + i]) end
redis.call('HSET', gw, token, 1)
for d, v in pairs(newblobs) do redis.call('HSET', blobs, d, v) end
redis.call('HSET', meta, 'bytes', bytes + add)
touch(ttl)
return {'ok'}
"""
)

# ARGV: ttl_ms, branch, token, record ('' for none), k (number of added pairs), then k
# (name, amount) pairs, then (name, value) pairs that are set. Replies: 'ok' | 'repeat' |
# 'no_branch'. The token field makes a retried call a no-op. The record is appended to the
# branch's request log, kept in the state hash: "<b>:rn" count, "<b>:r:<seq>" records.
COUNT_SESSION = (
    _COMMON
    + """
local ttl, b, k = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[5])
if redis.call('HEXISTS', meta, 'l' .. b) == 0 then return 'no_branch' end
if redis.call('HSETNX', cnt, 't:' .. ARGV[3], 1) == 0 then return 'repeat' end
for i = 6, 5 + 2 * k, 2 do redis.call('HINCRBY', cnt, b .. ':' .. ARGV[i], ARGV[i + 1]) end
for i = 6 + 2 * k, #ARGV, 2 do redis.call('HSET', cnt, b .. ':' .. ARGV[i], ARGV[i + 1]) end
if ARGV[4] ~= '' then
  local seq = redis.call('HINCRBY', st, b .. ':rn', 1) - 1
  redis.call('HSET', st, b .. ':r:' .. seq, ARGV[4])
end
touch(ttl)
return 'ok'
"""
)

# KEYS: the tenant's counters, the token's key. ARGV: token ttl_ms, then (name, amount)
# pairs. Replies: 'ok' | 'repeat'.
COUNT_TENANT = """
if not redis.call('SET', KEYS[2], 1, 'NX', 'PX', ARGV[1]) then return 'repeat' end
for i = 2, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
return 'ok'
"""

# A lease pool (sorted set: lease id -> deadline in ms by the Redis server's clock, which
# every gateway process shares). ``clock_ms``: now; ``keep_pool``: the key lives until its
# last deadline (an empty pool is deleted).
_LEASES = """
local function clock_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function keep_pool(key, now)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIRE', key, math.max(1, tonumber(last[2]) - now)) end
end
"""

# KEYS: the tenant's session index, its lease pool (used only with a lease), then one key
# per charge. ARGV: session ('' for none), max_sessions (-1: none), the index score below
# which a session has expired, lease id ('' for none), lease limit, lease period_ms, then
# per charge: amount, limit (-1: none), ttl_ms. Replies: {'ok'} | {'over', i, current}
# where i = 0 is the session count and i >= 1 the i-th charge | {'full', held, ms until
# the earliest lease's deadline}. Checks everything (dropping expired leases), then writes.
CHARGE = (
    _LEASES
    + """
local n, pool, lease = #KEYS - 2, KEYS[2], ARGV[4]
if ARGV[1] ~= '' and tonumber(ARGV[2]) >= 0 and not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
  local live = redis.call('ZCARD', KEYS[1])
  if live >= tonumber(ARGV[2]) then return {'over', 0, live} end
end
for i = 1, n do
  local amount, limit = tonumber(ARGV[4 + 3 * i]), tonumber(ARGV[5 + 3 * i])
  if limit >= 0 then
    local cur = tonumber(redis.call('GET', KEYS[2 + i]) or '0')
    if cur + math.max(amount, 1) > limit then return {'over', i, cur} end
  end
end
local now = 0
if lease ~= '' then
  now = clock_ms()
  redis.call('ZREMRANGEBYSCORE', pool, '-inf', now)
  local held = redis.call('ZCARD', pool)
  if held >= tonumber(ARGV[5]) and not redis.call('ZSCORE', pool, lease) then
    local first = redis.call('ZRANGE', pool, 0, 0, 'WITHSCORES')
    return {'full', held, tonumber(first[2]) - now}
  end
end
for i = 1, n do
  local amount = tonumber(ARGV[4 + 3 * i])
  if amount ~= 0 then
    if redis.call('INCRBY', KEYS[2 + i], amount) < 0 then redis.call('SET', KEYS[2 + i], 0) end
    redis.call('PEXPIRE', KEYS[2 + i], ARGV[6 + 3 * i])
  end
end
if lease ~= '' then
  redis.call('ZADD', pool, now + tonumber(ARGV[6]), lease)
  keep_pool(pool, now)
end
return {'ok'}
"""
)

# KEYS: a lease pool. ARGV: period_ms, then lease ids. Pushes each live lease's deadline
# to period_ms from now; replies with the ids no longer held.
RENEW_LEASES = (
    _LEASES
    + """
local now = clock_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local lost = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i])
  else
    lost[#lost + 1] = ARGV[i]
  end
end
keep_pool(KEYS[1], now)
return lost
"""
)

# KEYS: the assignment key. ARGV: has_expected ('1'/'0'), expected, replica, ttl_ms.
SET_ASSIGNMENT = """
local cur = redis.call('GET', KEYS[1])
if cur == false or cur == ARGV[3] or (ARGV[1] == '1' and cur == ARGV[2]) then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
  return ARGV[3]
end
return cur
"""
