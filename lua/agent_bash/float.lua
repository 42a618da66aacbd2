-- Card windows: open, draw what card.lua rendered, stack, toggle, close. Cards stack from the
-- bottom-right corner upward, newest at the bottom, and never cover the cursor: when the cursor
-- is under the stack, the stack moves to the larger side of it (and shrinks to fit). At most
-- one finished bang card stays (a new card replaces finished ones); running cards show up to
-- `card.max_running`, the others are counted on one `N more running` line; finished cards that
-- no longer fit are closed.

local M = {}
local H = {}

---@class agent_bash.Card
---@field run agent_bash.Run
---@field buf integer
---@field win? integer
---@field expanded boolean
---@field rendered? agent_bash.Rendered
---@field prev_win? integer window to return to when the card closes
---@field closed boolean
---@field hidden? boolean no room on screen (over the running limit, or the cursor is there): no window for now

local NS = vim.api.nvim_create_namespace('agent_bash_card')

--- Opens a card for a run and draws it.
---@param run agent_bash.Run
---@param opts? {enter?: boolean}
---@return agent_bash.Card
function M.open(run, opts)
  opts = opts or {}
  require('agent_bash.highlight').setup()
  H.autocmds()
  if run.state.origin == 'bang' then
    M.close_finished({ bang = true })
  end
  local buf = vim.api.nvim_create_buf(false, true)
  vim.bo[buf].bufhidden = 'hide' -- outlives its window while the card is hidden; deleted on close
  vim.bo[buf].tabstop = 8
  ---@type agent_bash.Card
  local card = { run = run, buf = buf, expanded = false, closed = false, prev_win = vim.api.nvim_get_current_win() }
  table.insert(H.cards, card)
  H.keymaps(card)
  vim.bo[buf].filetype = 'agent_bash_card'
  H.draw(card)
  M.layout()
  if opts.enter and card.win and vim.api.nvim_win_is_valid(card.win) then
    vim.api.nvim_set_current_win(card.win)
  end
  return card
end

--- Redraws a card from its run's state.
---@param card agent_bash.Card
function M.refresh(card)
  if card.closed then
    return
  end
  local win = card.win
  local follow = true
  if win and vim.api.nvim_win_is_valid(win) and vim.api.nvim_get_current_win() == win then
    -- the user reads in the card: follow the output only from its last line
    follow = vim.api.nvim_win_get_cursor(win)[1] >= vim.api.nvim_buf_line_count(card.buf)
  end
  H.draw(card)
  M.layout()
  if follow and card.win and vim.api.nvim_win_is_valid(card.win) then
    pcall(vim.api.nvim_win_set_cursor, card.win, { vim.api.nvim_buf_line_count(card.buf), 0 })
  end
end

--- Collapses or expands a card.
---@param card agent_bash.Card
function M.toggle(card)
  if not card.expanded and card.rendered and not card.rendered.expandable then
    return -- nothing hidden
  end
  card.expanded = not card.expanded
  M.refresh(card)
end

--- Closes a card (the command keeps running). Safe to call twice.
---@param card agent_bash.Card
---@param opts? {if_unfocused?: boolean, no_layout?: boolean} if_unfocused: leave it open when the cursor is in it
function M.close(card, opts)
  if card.closed then
    return
  end
  if opts and opts.if_unfocused and card.win and vim.api.nvim_get_current_win() == card.win then
    return
  end
  card.closed = true
  H.remove(card)
  local win = card.win
  card.win = nil
  if win and vim.api.nvim_win_is_valid(win) then
    local was_current = vim.api.nvim_get_current_win() == win
    pcall(vim.api.nvim_win_close, win, true)
    if was_current and card.prev_win and vim.api.nvim_win_is_valid(card.prev_win) then
      vim.api.nvim_set_current_win(card.prev_win)
    end
  end
  if vim.api.nvim_buf_is_valid(card.buf) then
    pcall(vim.api.nvim_buf_delete, card.buf, { force = true })
  end
  if not (opts and opts.no_layout) then
    M.layout()
  end
end

--- Loads the full artifact into a truncated card (replacing the tail it shows) and expands it.
---@param card agent_bash.Card
function M.load_full(card)
  local s = card.run.state
  local id = s.result and s.result.artifact_id
  if not id or s.full_lines then
    return
  end
  local ok, lines = H.artifact_lines(s.result)
  if not ok then
    vim.notify(lines, vim.log.levels.ERROR)
    return
  end
  s.full_lines = lines
  card.expanded = true
  M.refresh(card)
end

--- The card's whole output as lines: the artifact when the card holds only part of it (read
--- from disk through the backend), else the lines in hand. Nil and a message on failure.
---@param run agent_bash.Run
---@return string[]? lines
---@return string? err
function M.output_lines(run)
  local s = run.state
  if s.full_lines then
    return s.full_lines
  end
  local r = s.result
  local partial = (s.total_lines or 0) > #(s.lines or {}) or (r and r.truncated)
  if partial and r and r.artifact_id then
    local ok, lines = H.artifact_lines(r)
    if not ok then
      return nil, lines
    end
    return lines
  end
  return vim.list_slice(s.lines or {})
end

--- Yanks a card's output (linewise) into `register` (default: the unnamed one).
---@param card agent_bash.Card
---@param register? string
function M.yank(card, register)
  local lines, err = M.output_lines(card.run)
  if not lines then
    vim.notify('agent-bash: ' .. tostring(err), vim.log.levels.ERROR)
    return
  end
  register = (register == nil or register == '') and '"' or register
  vim.fn.setreg(register, lines, 'l')
  vim.notify(('agent-bash: yanked %d line%s'):format(#lines, #lines == 1 and '' or 's'), vim.log.levels.INFO)
end

--- Opens a card's output in a split of the window the card came from: `artifact://<id>` when
--- the output spilled, else a scratch buffer. The cursor goes there (`gF`, `:cbuffer` work).
---@param card agent_bash.Card
function M.split(card)
  local run = card.run
  local win = card.prev_win
  if not (win and vim.api.nvim_win_is_valid(win)) or vim.api.nvim_win_get_config(win).relative ~= '' then
    win = H.normal_window()
  end
  if win then
    vim.api.nvim_set_current_win(win)
  end
  local r = run.state.result
  if r and r.artifact_id and not run.state.full_lines then
    H.open_artifact(r, 'split')
    return
  end
  local lines, err = M.output_lines(run)
  if not lines then
    vim.notify('agent-bash: ' .. tostring(err), vim.log.levels.ERROR)
    return
  end
  vim.cmd('split')
  local buf = vim.api.nvim_create_buf(false, true)
  vim.bo[buf].bufhidden = 'wipe'
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  vim.bo[buf].modified = false
  pcall(vim.api.nvim_buf_set_name, buf, ('agent-bash://%d'):format(run.id))
  vim.api.nvim_win_set_buf(0, buf)
end

--- Whether a card is on screen.
---@param card? agent_bash.Card
---@return boolean
function M.visible(card)
  return card ~= nil and not card.closed and card.win ~= nil and vim.api.nvim_win_is_valid(card.win)
end

--- Redraws only the titles of running cards (their elapsed time): one window update per card.
function M.tick()
  for _, card in ipairs(H.cards) do
    if not card.run.finished and card.win and vim.api.nvim_win_is_valid(card.win) then
      if H.edges(H.border()).full then
        local width = card.rendered and card.rendered.width or H.width()
        local title = require('agent_bash.card').title(card.run.state, width)
        vim.api.nvim_win_set_config(card.win, { title = title, title_pos = 'left' })
        M.ticks = M.ticks + 1
      else
        M.refresh(card)
        M.ticks = M.ticks + 1
      end
    end
  end
end

--- Window updates made by `tick` (the bench counts them).
M.ticks = 0

--- Open cards, oldest first.
---@return agent_bash.Card[]
function M.cards()
  return vim.list_slice(H.cards)
end

--- Moves the cursor into a card (default: the newest), showing it first when it was hidden:
--- it becomes the newest, so it keeps its place on screen.
---@param card? agent_bash.Card
function M.focus(card)
  card = card or H.cards[#H.cards]
  if not card or card.closed then
    return
  end
  local prev = vim.api.nvim_get_current_win()
  if not card.win or not vim.api.nvim_win_is_valid(card.win) then
    H.remove(card)
    table.insert(H.cards, card)
    card.hidden = false
    H.focus_next = card
    M.layout()
    H.focus_next = nil
  end
  if card.win and vim.api.nvim_win_is_valid(card.win) then
    if prev ~= card.win then
      card.prev_win = prev
    end
    vim.api.nvim_set_current_win(card.win)
  end
end

--- The card of run `id` (open, shown or hidden), if any.
---@param id integer
---@return agent_bash.Card?
function M.find(id)
  for _, card in ipairs(H.cards) do
    if card.run.id == id then
      return card
    end
  end
end

--- Closes finished cards (not the one the cursor is in), and with `bang` only bang cards and
--- finished terminal floats: what a new bang card replaces.
---@param opts? {bang?: boolean, except?: agent_bash.Card}
function M.close_finished(opts)
  opts = opts or {}
  local current = vim.api.nvim_get_current_win()
  for _, card in ipairs(vim.list_slice(H.cards)) do
    local s = card.run.state
    if card.run.finished and card ~= opts.except and card.win ~= current and (not opts.bang or s.origin == 'bang') then
      M.close(card, { no_layout = true })
    end
  end
  require('agent_bash.terminal').close_finished()
end

--- Whether the cursor is in this card's window.
---@param card agent_bash.Card
---@return boolean
function M.focused(card)
  return card.win ~= nil and vim.api.nvim_win_is_valid(card.win) and vim.api.nvim_get_current_win() == card.win
end

--- Places every card: newest at the bottom right, older ones above, in the part of the screen
--- the cursor is not in (when the cursor is under the stack's columns, the larger side of its
--- row). Running cards beyond `card.max_running` are hidden and counted on one line; finished
--- cards that do not fit are closed (their runs go on), the newest card is shrunk or hidden.
function M.layout()
  local edges = H.edges(H.border())
  local columns = vim.o.columns
  local options = require('agent_bash.config').options
  local width = math.max(10, math.min(options.card.max_width, columns - edges.cols - 2))
  local max_height = options.card.max_height
  local top = H.top_row()
  local bottom = vim.o.lines - vim.o.cmdheight - (vim.o.laststatus > 0 and 1 or 0)
  local col = math.max(0, columns - width - edges.cols - 1)
  local cursor = H.cursor_cell()
  H.last_cursor = H.cursor_key(cursor, col)
  if cursor and cursor.col >= col and cursor.row >= top and cursor.row < bottom then
    if bottom - (cursor.row + 1) >= cursor.row - top then
      top = cursor.row + 1
    else
      bottom = cursor.row
    end
  end
  local extra = edges.rows
  local current = vim.api.nvim_get_current_win()
  local drop, hide, more = {}, {}, {}
  local running, placed = 0, 0
  for i = #H.cards, 1, -1 do
    local card = H.cards[i]
    local is_current = card.win ~= nil and card.win == current
    local live = not card.run.finished
    if live and not is_current and card ~= H.focus_next and running >= options.card.max_running then
      hide[#hide + 1] = card
      more[#more + 1] = card
    else
      if live then
        running = running + 1
      end
      if card.rendered and card.rendered.width ~= width then
        H.draw(card, width)
      end
      local height = math.min(card.rendered.height, max_height)
      -- one row is kept for the `N more running` line while cards are left out
      local floor = top + ((#more > 0 or H.more_needed(i, running, options)) and 1 or 0)
      if not live then
        -- A finished card leaves room for the running cards still to be placed above it: a
        -- long output must not push a running command off the screen.
        local room = bottom - floor - extra - H.live_rows(i, running, options, extra)
        if room < 1 and not is_current then
          height = 0
        else
          height = math.max(1, math.min(height, room))
        end
      end
      if height == 0 then
        drop[#drop + 1] = card
      elseif bottom - floor - extra < 1 or (bottom - (height + extra) < floor and placed > 0) then
        if live or placed == 0 then
          hide[#hide + 1] = card
          if live then
            more[#more + 1] = card
          end
        else
          drop[#drop + 1] = card
        end
      else
        height = math.max(1, math.min(height, bottom - floor - extra))
        local row = bottom - height - extra
        card.hidden = false
        H.place(card, row, col, width, height, edges)
        bottom = row
        placed = placed + 1
      end
    end
  end
  for _, card in ipairs(hide) do
    H.hide(card)
  end
  for _, card in ipairs(drop) do
    M.close(card, { no_layout = true })
  end
  H.more_line(more, bottom - 1 >= top and bottom - 1 or nil, col, width + edges.cols)
end

--- The cards that ran out of room: the run ids, for `:AgentBashFocus`.
---@return agent_bash.Card[]
function M.hidden()
  return vim.tbl_filter(function(c)
    return c.hidden
  end, H.cards)
end

--- Float conventions shared with terminal floats: the `border` to pass to nvim_open_win() (nil
--- when 'winborder' decides), whether the border has edges for a title and footer, the rows
--- and columns it takes, and the first editor row below the tabline.
---@return {border: string|string[]|nil, rows: integer, cols: integer, full: boolean, top: integer}
function M.frame()
  local edges = H.edges(H.border())
  return { border = H.border_arg(), rows = edges.rows, cols = edges.cols, full = edges.full, top = H.top_row() }
end

--- Applies the card window options (wrapping, highlights) to a float.
---@param win integer
function M.win_options(win)
  H.win_options(win)
end

-- Helpers -----------------------------------------------------------------------------------

H.cards = {} ---@type agent_bash.Card[]
H.more = nil ---@type {buf: integer, win?: integer}?
H.last_cursor = nil ---@type string?
H.focus_next = nil ---@type agent_bash.Card? a hidden card being focused: it gets a place

--- Rows the running cards older than index `i` that will be shown need at least (a few lines
--- of output each, and their borders).
H.LIVE_MIN_ROWS = 3
function H.live_rows(i, running, options, extra)
  local rows, shown = 0, running
  for j = i - 1, 1, -1 do
    local c = H.cards[j]
    if not c.run.finished and shown < options.card.max_running then
      shown = shown + 1
      local h = c.rendered and c.rendered.height or 1
      rows = rows + math.min(h, H.LIVE_MIN_ROWS) + extra
    end
  end
  return rows
end

--- Whether running cards older than index `i` will be left out (so a row is kept for the line
--- that counts them).
function H.more_needed(i, running, options)
  local live = 0
  for j = i - 1, 1, -1 do
    if not H.cards[j].run.finished then
      live = live + 1
    end
  end
  return live > 0 and running + live > options.card.max_running
end

--- The cursor's cell on the screen (0-based editor row and column), or nil when the cursor is
--- in a float (a card, a terminal): the stack keeps its place then.
---@return {row: integer, col: integer}?
function H.cursor_cell()
  local win = vim.api.nvim_get_current_win()
  if vim.api.nvim_win_get_config(win).relative ~= '' then
    return nil
  end
  local pos = vim.fn.screenpos(win, vim.fn.line('.'), vim.fn.col('.'))
  if not pos or pos.row == 0 then
    return nil
  end
  return { row = pos.row - 1, col = pos.col - 1 }
end

--- What of the cursor's position matters to the layout: its row when it is under the stack.
function H.cursor_key(cursor, col)
  if not cursor then
    return 'float'
  end
  return cursor.col >= col and ('row' .. cursor.row) or 'clear'
end

--- A card with no room: its window goes, the card stays (shown again when room comes back).
function H.hide(card)
  card.hidden = true
  local win = card.win
  card.win = nil
  if win and vim.api.nvim_win_is_valid(win) then
    pcall(vim.api.nvim_win_close, win, true)
  end
end

--- One line above the stack: `N more running (:AgentBashFocus <id>|…)` for the running cards
--- left out (nothing when none is, or there is no row for it).
function H.more_line(cards, row, col, width)
  if #cards == 0 or not row then
    if H.more and H.more.win and vim.api.nvim_win_is_valid(H.more.win) then
      pcall(vim.api.nvim_win_close, H.more.win, true)
    end
    if H.more then
      H.more.win = nil
    end
    return
  end
  local ids = {}
  for _, card in ipairs(cards) do
    ids[#ids + 1] = card.run.id
  end
  table.sort(ids, function(a, b)
    return a > b
  end)
  local text = (' %d more running (:AgentBashFocus %s)'):format(#cards, table.concat(ids, '|'))
  if vim.fn.strwidth(text) > width then
    text = vim.fn.strcharpart(text, 0, width - 1) .. '…'
  end
  if not (H.more and vim.api.nvim_buf_is_valid(H.more.buf)) then
    H.more = { buf = vim.api.nvim_create_buf(false, true) }
    vim.bo[H.more.buf].bufhidden = 'hide'
  end
  vim.api.nvim_buf_set_lines(H.more.buf, 0, -1, false, { text })
  local cfg = { relative = 'editor', row = row, col = col, width = width, height = 1, zindex = 45, focusable = false }
  if H.more.win and vim.api.nvim_win_is_valid(H.more.win) then
    vim.api.nvim_win_set_config(H.more.win, cfg)
  else
    cfg.style, cfg.border, cfg.noautocmd = 'minimal', 'none', true
    H.more.win = vim.api.nvim_open_win(H.more.buf, false, cfg)
    vim.wo[H.more.win].winhighlight = 'Normal:AgentBashMore,NormalFloat:AgentBashMore'
  end
end

--- The `N more running` line, as text (nil when not shown).
---@return string?
function M.more_text()
  if H.more and H.more.win and vim.api.nvim_win_is_valid(H.more.win) then
    return vim.api.nvim_buf_get_lines(H.more.buf, 0, 1, false)[1]
  end
end

--- A window that is not a float, preferring the current tab's previous window.
function H.normal_window()
  for _, w in ipairs({ vim.fn.win_getid(vim.fn.winnr('#')), unpack(vim.api.nvim_tabpage_list_wins(0)) }) do
    if w ~= 0 and vim.api.nvim_win_is_valid(w) and vim.api.nvim_win_get_config(w).relative == '' then
      return w
    end
  end
end

function H.remove(card)
  for i, c in ipairs(H.cards) do
    if c == card then
      table.remove(H.cards, i)
      return
    end
  end
end

--- The text width cards get now.
function H.width()
  local edges = H.edges(H.border())
  return math.max(10, math.min(require('agent_bash.config').options.card.max_width, vim.o.columns - edges.cols - 2))
end

--- Renders the run's state and writes it into the card's buffer.
function H.draw(card, width)
  width = width or H.width()
  card.drawn_focused = M.focused(card)
  local rendered = require('agent_bash.card').render(
    card.run.state,
    { width = width, expanded = card.expanded, focused = card.drawn_focused, id = card.run.id }
  )
  rendered.width = width
  if not H.edges(H.border()).full then
    H.frame(rendered)
  end
  card.rendered = rendered
  local buf = card.buf
  if not vim.api.nvim_buf_is_valid(buf) then
    return
  end
  vim.bo[buf].modifiable = true
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, rendered.lines)
  vim.bo[buf].modifiable = false
  vim.bo[buf].modified = false
  vim.api.nvim_buf_clear_namespace(buf, NS, 0, -1)
  local hl = require('agent_bash.highlight')
  local groups = {} -- style key → the (bounded) group that carries it
  for key, style in pairs(rendered.styles) do
    groups[key] = hl.ensure(key, style)
  end
  for _, h in ipairs(rendered.highlights) do
    local line = rendered.lines[h[1] + 1] or ''
    local end_col = math.min(h[3] < 0 and #line or h[3], #line)
    if end_col > h[2] then
      vim.api.nvim_buf_set_extmark(buf, NS, h[1], h[2], {
        end_col = end_col,
        hl_group = groups[h[4]] or h[4],
        -- ANSI colours under the card's own groups
        priority = h[4]:find('^AgentBashAnsi_') and 100 or 110,
      })
    end
  end
end

--- Without top and bottom border edges a float shows no title or footer: make them the first
--- and last lines of the text instead.
---@param r agent_bash.Rendered
function H.frame(r)
  local function chunks_line(chunks, row)
    local text, hls = '', {}
    for _, c in ipairs(chunks) do
      hls[#hls + 1] = { row, #text, #text + #c[1], c[2] }
      text = text .. c[1]
    end
    return text, hls
  end
  local highlights = {}
  for _, h in ipairs(r.highlights) do
    highlights[#highlights + 1] = { h[1] + 1, h[2], h[3], h[4] }
  end
  local title, title_hl = chunks_line(r.title, 0)
  local footer, footer_hl = chunks_line(r.footer, #r.lines + 1)
  r.lines = vim.list_extend({ title }, r.lines)
  r.lines[#r.lines + 1] = footer
  r.highlights = vim.list_extend(vim.list_extend(title_hl, highlights), footer_hl)
  r.height = r.height + require('agent_bash.card').rows(title, r.width) + require('agent_bash.card').rows(footer, r.width)
end

function H.place(card, row, col, width, height, edges)
  local r = card.rendered
  local cfg = {
    relative = 'editor',
    row = row,
    col = math.max(0, col),
    width = width,
    height = height,
    zindex = 45,
    focusable = true,
  }
  if edges.full then
    cfg.title, cfg.title_pos = r.title, 'left'
    cfg.footer, cfg.footer_pos = r.footer, 'right'
  end
  if card.win and vim.api.nvim_win_is_valid(card.win) then
    vim.api.nvim_win_set_config(card.win, cfg)
  else
    cfg.style = 'minimal'
    cfg.border = H.border_arg()
    cfg.noautocmd = false
    card.win = vim.api.nvim_open_win(card.buf, false, cfg)
    H.win_options(card.win)
    H.watch_close(card)
  end
end

function H.win_options(win)
  local wo = vim.wo[win]
  wo.wrap = true
  wo.linebreak = false
  wo.breakindent = false
  wo.showbreak = 'NONE'
  wo.list = false
  wo.spell = false
  wo.foldenable = false
  wo.scrolloff = 0
  wo.sidescrolloff = 0
  wo.winhighlight =
    'Normal:AgentBashNormal,NormalFloat:AgentBashNormal,FloatBorder:AgentBashBorder,FloatTitle:AgentBashTitle,FloatFooter:AgentBashFooter'
end

--- A finished run's full output as lines. A mirrored call's artifact (contract §11) is a file of
--- the MCP server that ran it (`artifact_path`), never this editor backend's artifact of the
--- same id (every backend numbers its own from the start).
---@param result agent_bash.BashResult
---@return boolean ok
---@return string[]|string lines_or_err
function H.artifact_lines(result)
  if result.artifact_path then
    local ok, text = require('agent_bash.mirror').read_artifact(result.artifact_path)
    if not ok then
      return false, text
    end
    return true, require('agent_bash.artifact').split(text)
  end
  return require('agent_bash.artifact').lines(result.artifact_id)
end

--- Opens a result's artifact in the current window (`cmd` 'edit') or a split ('split'), at
--- `line`: `artifact://<id>` of this editor's backend, or a mirrored call's file, read-only.
---@param result agent_bash.BashResult
---@param cmd 'edit'|'split'
---@param line? integer
function H.open_artifact(result, cmd, line)
  if not result.artifact_path then
    local url = 'artifact://' .. result.artifact_id .. (line and ('#L' .. line) or '')
    vim.cmd(cmd .. ' ' .. vim.fn.fnameescape(url))
    return
  end
  vim.cmd(cmd .. ' ' .. vim.fn.fnameescape(result.artifact_path))
  vim.bo.readonly, vim.bo.modifiable = true, false
  if line then
    pcall(vim.api.nvim_win_set_cursor, 0, { line, 0 })
  end
end

function H.keymaps(card)
  local options = require('agent_bash.config').options
  local map = function(lhs, fn, desc)
    vim.keymap.set('n', lhs, fn, { buffer = card.buf, nowait = true, silent = true, desc = 'agent-bash: ' .. desc })
  end
  map(options.keys.close, function()
    M.close(card)
  end, 'close the card')
  map(options.keys.toggle, function()
    M.toggle(card)
  end, 'collapse/expand the card')
  map(options.keys.full_output, function()
    M.load_full(card)
  end, 'load the full output')
  map('<CR>', function()
    local row = vim.api.nvim_win_get_cursor(0)[1] - 1
    local url = card.rendered and require('agent_bash.card').link_at(card.rendered, row)
    if url then
      vim.cmd('wincmd p')
      local r = card.run.state.result
      if r and r.artifact_path then
        H.open_artifact(r, 'edit', tonumber(url:match('#L(%d+)')))
      else
        vim.cmd.edit(vim.fn.fnameescape(url))
      end
    end
  end, 'open a rescued line in its artifact')
  map(options.keys.yank, function()
    M.yank(card, vim.v.register)
  end, "yank the card's output")
  map(options.keys.split, function()
    M.split(card)
  end, "open the card's output in a split")
  if options.kill_key then
    -- In the card it entered: a running command is cancelled, a finished card closes.
    map(options.kill_key, function()
      if card.run.finished then
        M.close(card)
      else
        require('agent_bash.runs').cancel(card.run)
      end
    end, 'cancel the running command, close a finished card')
  end
end

--- A card closed by other means (`:q`, `<C-w>o`) leaves the stack too.
function H.watch_close(card)
  local win = card.win
  vim.api.nvim_create_autocmd('WinClosed', {
    group = H.augroup,
    pattern = tostring(win),
    once = true,
    callback = function()
      if not card.closed and card.win == win then -- not a window we hid ourselves
        card.closed = true
        card.win = nil
        H.remove(card)
        vim.schedule(function()
          if vim.api.nvim_buf_is_valid(card.buf) then
            pcall(vim.api.nvim_buf_delete, card.buf, { force = true })
          end
          M.layout()
        end)
      end
    end,
  })
end

function H.autocmds()
  if H.augroup then
    return
  end
  H.augroup = vim.api.nvim_create_augroup('agent_bash_float', { clear = true })
  -- The stack never covers the cursor: it moves when the cursor goes under it.
  vim.api.nvim_create_autocmd({ 'CursorMoved', 'CursorMovedI', 'WinScrolled', 'WinEnter' }, {
    group = H.augroup,
    desc = 'agent-bash: keep cards off the cursor',
    callback = function()
      if #H.cards == 0 then
        return
      end
      local edges = H.edges(H.border())
      local col = math.max(0, vim.o.columns - H.width() - edges.cols - 1)
      if H.cursor_key(H.cursor_cell(), col) ~= H.last_cursor then
        M.layout()
      end
    end,
  })
  -- Hints say what works where the cursor is: a card's keys inside it, commands outside.
  vim.api.nvim_create_autocmd({ 'WinEnter', 'WinLeave' }, {
    group = H.augroup,
    desc = 'agent-bash: card hints follow the focus',
    callback = function()
      vim.schedule(function()
        for _, card in ipairs(H.cards) do
          if card.win and vim.api.nvim_win_is_valid(card.win) and (card.drawn_focused or false) ~= M.focused(card) then
            M.refresh(card)
          end
        end
      end)
    end,
  })
  vim.api.nvim_create_autocmd({ 'VimResized', 'OptionSet' }, {
    group = H.augroup,
    pattern = { '*' },
    desc = 'agent-bash: re-layout cards',
    callback = function(ev)
      if ev.event == 'OptionSet' and not vim.tbl_contains({ 'cmdheight', 'laststatus', 'showtabline', 'winborder' }, ev.match) then
        return
      end
      if #H.cards > 0 then
        M.layout()
      end
    end,
  })
end

--- The first editor row below the tabline.
function H.top_row()
  local st = vim.o.showtabline
  return (st == 2 or (st == 1 and #vim.api.nvim_list_tabpages() > 1)) and 1 or 0
end

--- The border in effect: the `border` option, else 'winborder' when set, else 'rounded'.
---@return string|string[]
function H.border()
  local b = require('agent_bash.config').options.border
  if b ~= nil then
    return b
  end
  local wb = vim.fn.exists('+winborder') == 1 and vim.o.winborder or ''
  return wb ~= '' and wb or 'rounded'
end

--- What to pass to nvim_open_win: nothing when 'winborder' decides (Neovim applies it).
function H.border_arg()
  if require('agent_bash.config').options.border == nil and vim.fn.exists('+winborder') == 1 and vim.o.winborder ~= '' then
    return nil
  end
  return H.border()
end

--- Rows and columns a border takes, and whether it has a top and bottom edge for title/footer.
---@return {rows: integer, cols: integer, full: boolean}
function H.edges(border)
  if border == 'none' or border == '' then
    return { rows = 0, cols = 0, full = false }
  elseif border == 'shadow' then
    return { rows = 1, cols = 1, full = false }
  end
  return { rows = 2, cols = 2, full = true }
end

return M
