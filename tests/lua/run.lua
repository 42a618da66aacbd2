-- A tiny spec runner. Usage, from the repository root:
--   "$NVIM_BIN" --headless --clean -n -i NONE --cmd "set rtp^=$PWD" -l tests/lua/run.lua tests/lua/card_spec.lua
-- A spec file receives the helpers as its chunk argument (`local t = ...`) and registers
-- tests with t.describe / t.it. Prints one line per test and a summary; exits 1 on failure.

local t = {}
local tests = {}
local prefix = {}

---@param name string
---@param fn fun()
function t.describe(name, fn)
  table.insert(prefix, name)
  fn()
  table.remove(prefix)
end

---@param name string
---@param fn fun()
function t.it(name, fn)
  local full = table.concat(prefix, ' ') .. (#prefix > 0 and ' ' or '') .. name
  tests[#tests + 1] = { name = full, fn = fn }
end

--- Deep equality; on failure shows both values (and the first differing line for string lists).
function t.eq(expected, actual, msg)
  if vim.deep_equal(expected, actual) then
    return
  end
  local detail = ''
  if type(expected) == 'table' and type(actual) == 'table' and vim.islist(expected) and vim.islist(actual) then
    for i = 1, math.max(#expected, #actual) do
      if not vim.deep_equal(expected[i], actual[i]) then
        detail = ('\nfirst difference at [%d]:\n  expected: %s\n  actual:   %s'):format(
          i,
          vim.inspect(expected[i]),
          vim.inspect(actual[i])
        )
        break
      end
    end
  end
  error(
    ('%sexpected:\n%s\nactual:\n%s%s'):format(msg and (msg .. '\n') or '', vim.inspect(expected), vim.inspect(actual), detail),
    2
  )
end

function t.ok(value, msg)
  if not value then
    error(msg or 'expected a truthy value', 2)
  end
end

--- Asserts that fn raises an error whose message contains `needle` (plain text).
function t.raises(fn, needle)
  local ok, err = pcall(fn)
  if ok then
    error('expected an error containing ' .. vim.inspect(needle), 2)
  end
  if needle and not tostring(err):find(needle, 1, true) then
    error(('error %s does not contain %s'):format(vim.inspect(tostring(err)), vim.inspect(needle)), 2)
  end
  return tostring(err)
end

--- Waits (processing events) until cond() is truthy; fails after `ms`.
function t.wait(cond, ms, what)
  if not vim.wait(ms or 2000, cond, 5) then
    error('timed out waiting for ' .. (what or 'a condition'), 2)
  end
end

t.root = vim.fn.getcwd()

local path = _G.arg[1]
if not path then
  io.stderr:write('usage: nvim -l tests/lua/run.lua <spec.lua>\n')
  os.exit(2)
end
local chunk, err = loadfile(path)
if not chunk then
  io.stderr:write(err .. '\n')
  os.exit(1)
end
chunk(t)

local failed = 0
local started = vim.uv.hrtime()
for _, test in ipairs(tests) do
  local ok, terr = xpcall(test.fn, debug.traceback)
  if ok then
    io.stdout:write(('  ok   %s\n'):format(test.name))
  else
    failed = failed + 1
    io.stdout:write(('  FAIL %s\n%s\n'):format(test.name, terr))
  end
end
io.stdout:write(
  ('%s: %d passed, %d failed (%.0f ms)\n'):format(path, #tests - failed, failed, (vim.uv.hrtime() - started) / 1e6)
)
io.stdout:flush()
os.exit(failed > 0 and 1 or 0)
