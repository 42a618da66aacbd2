-- Terminal floats for PTY runs (contract §6). The backend owns the PTY: when a PTY run starts it
-- calls `_open` (a request), which shows a float with a terminal channel (nvim_open_term) and
-- returns the channel and the window size; the backend then writes the raw PTY bytes into that
-- channel itself. Keys typed in the terminal go back as `pty_input`, window sizes as
-- `pty_resize`, the kill key as `cancel`. When the run ends, the float shows the status and
-- <Tab> switches to the card of the model-facing text (card.lua renders both).

local M = {}
local H = {}

local log = require('agent_bash.log')

---@class agent_bash.Term
---@field id integer the run's id
---@field run? agent_bash.Run nil when the backend opened a terminal for a run Lua does not know
---@field state agent_bash.CardState the run's state (drives the title and footer)
---@field buf integer
---@field win? integer
---@field chan integer terminal channel the backend writes to
---@field cols integer size last reported to the backend
---@field rows integer
---@field prev_win integer window to return to when the float closes
---@field finished boolean
---@field closed boolean the window is closed (the buffer lives until the run ends)

---@class agent_bash.TermOpenOpts
---@field command string
---@field origin agent_bash.Origin

M.MIN_COLS, M.MIN_ROWS = 20, 5 -- the smallest PTY the backend accepts (contract §6)
M.SCALE = 0.8 -- share of the editor a terminal float takes
M.ZINDEX = 46 -- above cards (45): the terminal is what the user works in

--- Called by the backend (nvim_exec_lua, a request) when a PTY run starts: shows a terminal
--- float for run `id` and returns its channel and size. Bang runs take the cursor in terminal
--- mode; tool runs do not take focus.
---@param id integer
---@param opts agent_bash.TermOpenOpts
---@return {chan: integer, cols: integer, rows: integer}
function M._open(id, opts)
  local ok, res = xpcall(H.open, debug.traceback, id, opts)
  if not ok then
    log.error('terminal for run %s: %s', tostring(id), res)
    error(res, 0)
  end
  return res
end

--- Redraws a terminal's title and footer from its run's state.
---@param term agent_bash.Term
function M.refresh(term)
  if term.win and vim.api.nvim_win_is_valid(term.win) and H.frame().full then
    local title, footer = H.chrome(term)
    vim.api.nvim_win_set_config(term.win, { title = title, title_pos = 'left', footer = footer, footer_pos = 'right' })
  end
end

--- The run ended: show its status, leave terminal mode (the program no longer reads keys), and
--- drop the buffer when its window was already closed.
---@param term agent_bash.Term
function M.finish(term)
  if term.finished then
    return
  end
  term.finished = true
  if term.closed then
    H.forget(term)
    return
  end
  M.refresh(term)
  if vim.api.nvim_get_current_win() == term.win and vim.api.nvim_get_mode().mode == 't' then
    vim.cmd.stopinsert()
  end
end

--- Replaces a finished terminal with the card of its model-facing text.
---@param term agent_bash.Term
function M.to_card(term)
  if not term.finished then
    vim.notify('agent-bash: the command is still running', vim.log.levels.INFO)
    return
  end
  local run = term.run
  M.close(term)
  if run then
    run.card = require('agent_bash.float').open(run, { enter = true })
  end
end

--- Closes a terminal's float. A running command keeps running (`:AgentBashFocus` shows it
--- again); a finished one's buffer is wiped. Safe to call twice.
---@param term agent_bash.Term
function M.close(term)
  local win = term.win
  term.win, term.closed = nil, true
  if win and vim.api.nvim_win_is_valid(win) then
    local was_current = vim.api.nvim_get_current_win() == win
    pcall(vim.api.nvim_win_close, win, true)
    if was_current and vim.api.nvim_win_is_valid(term.prev_win) then
      vim.api.nvim_set_current_win(term.prev_win)
    end
  end
  if term.finished then
    H.forget(term)
  end
end

--- Closes the floats of finished terminals (not the one the cursor is in): a new bang card
--- replaces them, as it replaces finished cards, and `:AgentBashClose` closes them.
function M.close_finished()
  local current = vim.api.nvim_get_current_win()
  for _, term in pairs(vim.tbl_extend('force', {}, H.terms)) do
    if term.finished and term.win ~= current then
      M.close(term)
    end
  end
end

--- Moves into a terminal (default: the newest running one), showing it again if its float was
--- closed, in terminal mode while it runs. Returns false when there is none.
---@param term? agent_bash.Term
---@return boolean
function M.focus(term)
  term = term or H.newest_running()
  if not term or not vim.api.nvim_buf_is_valid(term.buf) then
    return false
  end
  if not (term.win and vim.api.nvim_win_is_valid(term.win)) then
    term.prev_win = vim.api.nvim_get_current_win()
    H.show(term)
  elseif vim.api.nvim_get_current_win() ~= term.win then
    term.prev_win = vim.api.nvim_get_current_win()
  end
  vim.api.nvim_set_current_win(term.win)
  if not term.finished then
    vim.cmd.startinsert()
  end
  return true
end

--- Open terminals (running or finished, shown or not), by run id.
---@return table<integer, agent_bash.Term>
function M.terms()
  return vim.tbl_extend('force', {}, H.terms)
end

--- The terminal of run `id`, if any.
---@param id integer
---@return agent_bash.Term?
function M.get(id)
  return H.terms[id]
end

--- Re-places every shown terminal float (the editor was resized) and reports the new sizes.
function M.layout()
  for _, term in pairs(H.terms) do
    if term.win and vim.api.nvim_win_is_valid(term.win) then
      vim.api.nvim_win_set_config(term.win, H.win_config(term))
      H.report_size(term)
    end
  end
end

-- Helpers -----------------------------------------------------------------------------------

H.terms = {} ---@type table<integer, agent_bash.Term>

---@param id integer
---@param opts agent_bash.TermOpenOpts
function H.open(id, opts)
  local validate = require('agent_bash.config').validate
  validate('id', id, 'number')
  validate('opts', opts, 'table')
  validate('opts.command', opts.command, 'string')
  validate('opts.origin', opts.origin, function(o)
    return o == 'bang' or o == 'tool'
  end, false, "'bang' or 'tool'")
  require('agent_bash.highlight').setup()
  H.autocmds()
  local run = require('agent_bash.runs').get(id)
  local buf = vim.api.nvim_create_buf(false, true)
  vim.bo[buf].bufhidden = 'hide' -- outlives a closed window while the command runs
  ---@type agent_bash.Term
  local term = {
    id = id,
    run = run,
    state = run and run.state
      or { origin = opts.origin, command = opts.command, status = 'running', lines = {}, hl = {}, total_lines = 0 },
    buf = buf,
    chan = 0,
    cols = 0,
    rows = 0,
    prev_win = vim.api.nvim_get_current_win(),
    finished = false,
    closed = false,
  }
  H.show(term)
  -- With its buffer current, or the terminal gets wrong colours (neovim #37579). nvim_win_call
  -- makes the float's window and buffer current without entering it or firing autocmds.
  term.chan = vim.api.nvim_win_call(term.win, function()
    return vim.api.nvim_open_term(buf, {
      force_crlf = false, -- PTY output already has \r\n
      on_input = function(_, _, _, data)
        H.input(term, data)
      end,
    })
  end)
  vim.bo[buf].filetype = 'agent_bash_term'
  H.keymaps(term)
  H.terms[id] = term
  if run then
    if run.card then -- a tool call's card: the terminal takes its place
      require('agent_bash.float').close(run.card)
      run.card = nil
    end
    run.term = term
  end
  term.cols, term.rows = vim.api.nvim_win_get_width(term.win), vim.api.nvim_win_get_height(term.win)
  log.info('terminal for run %d: channel %d, %dx%d', id, term.chan, term.cols, term.rows)
  if opts.origin == 'bang' then
    pcall(vim.api.nvim_set_current_win, term.win) -- refused while the command line is busy: stay put
    -- after the backend's request returns: entering terminal mode inside it is not reliable
    vim.schedule(function()
      if term.win and vim.api.nvim_get_current_win() == term.win and not term.finished then
        vim.cmd.startinsert()
      end
    end)
  end
  return { chan = term.chan, cols = term.cols, rows = term.rows }
end

--- Opens the float showing the terminal's buffer (not entered).
function H.show(term)
  local cfg = H.win_config(term)
  cfg.style = 'minimal'
  cfg.border = H.frame().border
  cfg.focusable = true
  term.win = vim.api.nvim_open_win(term.buf, false, cfg)
  term.closed = false
  require('agent_bash.float').win_options(term.win)
  H.watch_close(term)
end

function H.frame()
  return require('agent_bash.float').frame()
end

--- Size and place: 80% of the editor, at least 20x5 when the editor has room, centered.
function H.win_config(term)
  local frame = H.frame()
  local top = frame.top
  local bottom = vim.o.lines - vim.o.cmdheight - (vim.o.laststatus > 0 and 1 or 0)
  local max_w = math.max(1, vim.o.columns - frame.cols)
  local max_h = math.max(1, bottom - top - frame.rows)
  local width = math.min(max_w, math.max(M.MIN_COLS, math.floor(vim.o.columns * M.SCALE)))
  local height = math.min(max_h, math.max(M.MIN_ROWS, math.floor((bottom - top) * M.SCALE)))
  local cfg = {
    relative = 'editor',
    row = top + math.floor((bottom - top - height - frame.rows) / 2),
    col = math.floor((vim.o.columns - width - frame.cols) / 2),
    width = width,
    height = height,
    zindex = M.ZINDEX,
  }
  if frame.full then
    cfg.title, cfg.footer = H.chrome(term, width)
    cfg.title_pos, cfg.footer_pos = 'left', 'right'
  end
  return cfg
end

function H.chrome(term, width)
  width = width or (term.win and vim.api.nvim_win_get_width(term.win)) or 80
  local focused = term.win ~= nil and term.win == vim.api.nvim_get_current_win()
  return require('agent_bash.card').term_chrome(term.state, { width = width, focused = focused })
end

--- Keys typed in terminal mode, forwarded raw (the backend translates them for the program).
function H.input(term, data)
  if term.finished then
    return -- the backend ignores input after the end anyway
  end
  require('agent_bash.backend').send('pty_input', { id = term.id, data = data })
end

--- Reports the window's size to the backend when it changed.
function H.report_size(term)
  if term.finished or not (term.win and vim.api.nvim_win_is_valid(term.win)) then
    return
  end
  local cols, rows = vim.api.nvim_win_get_width(term.win), vim.api.nvim_win_get_height(term.win)
  if cols == term.cols and rows == term.rows then
    return
  end
  term.cols, term.rows = cols, rows
  require('agent_bash.backend').send('pty_resize', { id = term.id, cols = cols, rows = rows })
end

--- Force-kills the running command.
function H.kill(term)
  if term.run then
    require('agent_bash.runs').cancel(term.run)
  else
    require('agent_bash.backend').send('cancel', { id = term.id })
  end
end

function H.keymaps(term)
  local options = require('agent_bash.config').options
  local map = function(mode, lhs, fn, desc, expr)
    vim.keymap.set(mode, lhs, fn, { buffer = term.buf, nowait = true, silent = true, expr = expr, desc = 'agent-bash: ' .. desc })
  end
  -- Every key but this chord, <Esc> included, goes to the program (vim, fzf, htop use <Esc>).
  local chord = options.term_kill_key
  if chord then
    map('t', chord, function()
      if term.finished then
        return '<C-\\><C-n>'
      end
      H.kill(term)
      return ''
    end, 'kill the running command (normal mode once it ended)', true)
    map('n', chord, function()
      if not term.finished then
        H.kill(term)
      end
    end, 'kill the running command')
  end
  if options.kill_key then
    -- In normal mode <Esc> by habit never kills: it only closes a finished terminal.
    map('n', options.kill_key, function()
      if term.finished then
        M.close(term)
      end
    end, 'close the finished terminal')
  end
  map('n', options.keys.toggle, function()
    M.to_card(term)
  end, 'switch to the card of the model-facing text')
  map('n', options.keys.close, function()
    M.close(term)
  end, 'close the terminal')
end

--- A float closed by other means (`:q`, `<C-w>o`) counts as closed.
function H.watch_close(term)
  local win = term.win
  vim.api.nvim_create_autocmd('WinClosed', {
    group = H.augroup,
    pattern = tostring(win),
    once = true,
    callback = function()
      if term.win == win then
        term.win, term.closed = nil, true
        if term.finished then
          vim.schedule(function()
            H.forget(term)
          end)
        end
      end
    end,
  })
end

function H.forget(term)
  if H.terms[term.id] == term then
    H.terms[term.id] = nil
  end
  if vim.api.nvim_buf_is_valid(term.buf) then
    pcall(vim.api.nvim_buf_delete, term.buf, { force = true })
  end
end

function H.newest_running()
  local best
  for id, term in pairs(H.terms) do
    if not term.finished and vim.api.nvim_buf_is_valid(term.buf) and (not best or id > best.id) then
      best = term
    end
  end
  return best
end

function H.autocmds()
  if H.augroup then
    return
  end
  H.augroup = vim.api.nvim_create_augroup('agent_bash_terminal', { clear = true })
  vim.api.nvim_create_autocmd('WinResized', {
    group = H.augroup,
    desc = 'agent-bash: report terminal sizes to the backend',
    callback = function()
      -- v:event.windows lists the windows that changed; without it, check every terminal
      -- (report_size sends only real changes)
      local wins = vim.v.event.windows
      local changed = {}
      for _, win in ipairs(wins or {}) do
        changed[win] = true
      end
      for _, term in pairs(H.terms) do
        if term.win and (changed[term.win] or not wins or #wins == 0) then
          H.report_size(term)
        end
      end
    end,
  })
  vim.api.nvim_create_autocmd('WinEnter', {
    group = H.augroup,
    desc = 'agent-bash: a waiting terminal says how to answer from where the cursor is',
    callback = function()
      for _, term in pairs(H.terms) do
        if term.state and term.state.waiting_input and not term.finished then
          M.refresh(term)
        end
      end
    end,
  })
  vim.api.nvim_create_autocmd('VimResized', {
    group = H.augroup,
    desc = 'agent-bash: re-layout terminal floats',
    callback = function()
      M.layout()
    end,
  })
end

return M
