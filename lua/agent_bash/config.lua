-- Configuration: defaults (one comment per option), validation, merge.
-- The plugin works without setup(); setup(opts) only merges into these defaults.

local M = {}
local H = {}

---@class agent_bash.Keys
---@field close string closes a card
---@field toggle string collapses/expands a card
---@field full_output string loads the full artifact into a truncated card
---@field yank string yanks a card's output
---@field split string opens a card's output in a split

---@class agent_bash.CardConfig
---@field max_width integer widest card, in columns (the editor width wins when smaller)
---@field max_height integer tallest card, in rows (expanded cards scroll)
---@field collapsed_lines integer display lines a collapsed tool-call card shows
---@field bang_lines integer logical lines a running/collapsed bang card shows
---@field show_tool_cards boolean open a card for each tool call
---@field auto_close integer|false close finished tool-call cards after this many ms (not while focused or expanded)
---@field max_running integer running cards on screen at once; the others are counted on one line
---@field enter boolean move the cursor into a bang command's card when it opens

---@class agent_bash.QuickfixConfig
---@field auto boolean fill the quickfix list when a run exits non-zero with recognized errors
---@field compilers table<string, string|false> program name → `:compiler` whose 'errorformat' reads its output

---@class agent_bash.Config
---@field bin? string backend binary
---@field settings_file? string backend settings (TOML), passed as `--config`
---@field kill_key string|false key that cancels the running command in a focused card
---@field term_kill_key string|false key that force-kills the program of a terminal float
---@field quickfix agent_bash.QuickfixConfig
---@field prewarm boolean start the backend and the shell when the UI is idle after start-up
---@field keys agent_bash.Keys
---@field card agent_bash.CardConfig
---@field border? string|string[] float border; nil follows 'winborder'
---@field icons table<agent_bash.Status, string>
---@field log_level 'debug'|'info'|'warn'|'error'

---@type agent_bash.Config
M.defaults = {
  -- Backend binary. nil: <plugin root>/target/release/agent-bash, else `agent-bash` on $PATH.
  bin = nil,
  -- Backend settings file (TOML), passed as `agent-bash nvim --config <file>`. nil: none.
  settings_file = nil,
  -- Key that cancels the running command inside a focused card (and closes a finished one).
  -- false: none (`:AgentBashCancel` still cancels).
  kill_key = '<Esc>',
  -- Key that force-kills the program of a terminal float. Every other key, <Esc> included,
  -- goes to the program; the default is a chord no common terminal program uses. false: none.
  term_kill_key = '<C-\\><C-k>',
  -- Buffer-local keys inside cards.
  keys = {
    close = 'q', -- close the card (the command keeps running)
    toggle = '<Tab>', -- collapse / expand
    full_output = 'o', -- load artifact://<id> into a truncated card
    yank = 'y', -- yank the card's output (the full output when truncated) into v:register
    split = '<C-s>', -- open the card's output in a split
  },
  card = {
    max_width = 100, -- widest card, in columns (capped by the editor width)
    max_height = 30, -- tallest card, in rows; longer content scrolls
    collapsed_lines = 10, -- display lines a collapsed tool-call card shows (contract §8.1)
    bang_lines = 20, -- logical lines a bang card shows while running / collapsed (contract §8.2)
    show_tool_cards = true, -- false: tool calls draw nothing (agent plugins render on_update)
    auto_close = 10000, -- ms after which a finished tool-call card closes (unless the cursor is in it or it is expanded); false: stays
    max_running = 3, -- running cards on screen at once; the others are counted on one `N more running` line
    enter = false, -- true: a bang command's card takes the cursor when it opens
  },
  -- Errors → quickfix (`:AgentBashQuickfix`).
  quickfix = {
    -- Fill the quickfix list when a run exits non-zero and its output has recognized errors.
    auto = true,
    -- Program (first word of the command) → `:compiler` whose 'errorformat' reads its output.
    -- Other programs use the 'errorformat' of the window the command was typed in (so the
    -- user's own `:compiler` applies). false removes an entry.
    compilers = {
      cargo = 'cargo',
      rustc = 'rustc',
      gcc = 'gcc',
      ['g++'] = 'gcc',
      cc = 'gcc',
      clang = 'gcc',
      ['clang++'] = 'gcc',
      make = 'gcc',
      tsc = 'tsc',
      eslint = 'eslint',
      pytest = 'pytest',
      go = 'go',
    },
  },
  -- Start the backend and the bang shell (its rc snapshot) once the UI is idle after start-up,
  -- so the first command does not wait for them.
  prewarm = true,
  -- Float border. nil: follow 'winborder' when set, else 'rounded'. Any nvim_open_win() border.
  border = nil,
  -- Status icons in card titles (plain characters: one cell each).
  icons = {
    running = '●',
    done = '✓',
    error = '✗',
    cancelled = '⊘',
    timed_out = '◷',
    failed = '✗',
  },
  -- Lua-side log level; the log is stdpath('log')/agent_bash.log (shared with the backend).
  log_level = 'info',
}

---@type agent_bash.Config
M.options = vim.deepcopy(M.defaults)

--- Merges `opts` into the current options after validating them. Raises a clear error on bad
--- values (nothing is changed then).
---@param opts? table
function M.setup(opts)
  opts = opts or {}
  if type(opts) ~= 'table' then
    error(('agent_bash.setup: expected a table, got %s'):format(vim.inspect(opts)), 2)
  end
  local merged = vim.tbl_deep_extend('force', vim.deepcopy(M.options), opts)
  local ok, err = pcall(H.check, opts, merged)
  if not ok then
    error('agent_bash.setup: ' .. tostring(err):gsub('^[^:]*:%d+: ', ''), 2)
  end
  M.options = merged
end

--- Validates one value like vim.validate's first form, on Neovim 0.10 and 0.11 alike.
---@param name string
---@param value any
---@param validator string|string[]|fun(v: any): boolean
---@param optional? boolean
---@param message? string shown as "expected <message>" for function validators
function M.validate(name, value, validator, optional, message)
  if value == nil and optional then
    return
  end
  if type(validator) == 'function' then
    if not validator(value) then
      error(('%s: expected %s, got %s'):format(name, message or 'a valid value', vim.inspect(value)), 0)
    end
    return
  end
  local types = type(validator) == 'table' and validator or { validator }
  for _, t in ipairs(types) do
    if type(value) == t or (t == 'callable' and vim.is_callable(value)) then
      return
    end
  end
  error(('%s: expected %s, got %s'):format(name, table.concat(types, '|'), vim.inspect(value)), 0)
end

-- Helpers -----------------------------------------------------------------------------------

local function positive_int(v)
  return type(v) == 'number' and v >= 1 and math.floor(v) == v
end

---@param opts table what the user passed (to catch unknown keys)
---@param o agent_bash.Config the merged result
function H.check(opts, o)
  H.unknown(opts, M.defaults, '')
  local v = M.validate
  v('bin', o.bin, 'string', true)
  v('settings_file', o.settings_file, 'string', true)
  for _, name in ipairs({ 'kill_key', 'term_kill_key' }) do
    v(name, o[name], function(x)
      return x == false or (type(x) == 'string' and x ~= '')
    end, false, 'a key (string) or false')
  end
  v('keys', o.keys, 'table')
  for _, k in ipairs({ 'close', 'toggle', 'full_output', 'yank', 'split' }) do
    v('keys.' .. k, o.keys[k], function(x)
      return type(x) == 'string' and x ~= ''
    end, false, 'a key (non-empty string)')
  end
  v('card', o.card, 'table')
  for _, k in ipairs({ 'max_width', 'max_height', 'collapsed_lines', 'bang_lines', 'max_running' }) do
    v('card.' .. k, o.card[k], positive_int, false, 'a positive integer')
  end
  v('card.show_tool_cards', o.card.show_tool_cards, 'boolean')
  v('card.auto_close', o.card.auto_close, function(x)
    return x == false or (type(x) == 'number' and x >= 0)
  end, false, 'milliseconds (number >= 0) or false')
  v('card.enter', o.card.enter, 'boolean')
  v('quickfix', o.quickfix, 'table')
  v('quickfix.auto', o.quickfix.auto, 'boolean')
  v('quickfix.compilers', o.quickfix.compilers, 'table')
  for prog, name in pairs(o.quickfix.compilers) do
    v('quickfix.compilers.' .. tostring(prog), name, function(x)
      return x == false or (type(x) == 'string' and x:match('^[%w_.-]+$') ~= nil)
    end, false, 'a compiler name or false')
  end
  v('prewarm', o.prewarm, 'boolean')
  v('border', o.border, { 'string', 'table' }, true)
  v('icons', o.icons, 'table')
  for k in pairs(M.defaults.icons) do
    v('icons.' .. k, o.icons[k], 'string')
  end
  v('log_level', o.log_level, function(x)
    return x == 'debug' or x == 'info' or x == 'warn' or x == 'error'
  end, false, "'debug', 'info', 'warn' or 'error'")
end

--- Rejects keys the defaults do not know (typos would otherwise be silently ignored).
function H.unknown(opts, defaults, prefix)
  for k, val in pairs(opts) do
    local known = defaults[k] ~= nil or (prefix == '' and (k == 'bin' or k == 'settings_file' or k == 'border'))
    if not known then
      error(('unknown option %q'):format(prefix .. tostring(k)), 0)
    end
    -- quickfix.compilers takes any program name
    if type(val) == 'table' and type(defaults[k]) == 'table' and not vim.islist(val) and prefix .. k ~= 'quickfix.compilers' then
      H.unknown(val, defaults[k], prefix .. k .. '.')
    end
  end
end

return M
