-- Cards (contract §8.1 tool call, §8.2 bang command), rendered as data: state + width → lines,
-- highlights, title and footer. No window or buffer calls here; float.lua places the result.

local M = {}
local H = {}

M.MAX_LINE_CHARS = 4000 -- contract §8.2: each line clamped to 4000 characters
M.DEFAULT_LIMIT_BYTES = 51200 -- the sink's window (contract §4.2) when the backend does not say

--- Renders one card.
---@param state agent_bash.CardState
---@param opts agent_bash.CardOpts
---@return agent_bash.Rendered
function M.render(state, opts)
  local options = require('agent_bash.config').options
  local ctx = {
    state = state,
    width = math.max(opts.width or 80, 10),
    expanded = opts.expanded and true or false,
    keys = opts.keys or options.keys,
    kill_key = opts.kill_key == nil and options.kill_key or opts.kill_key,
    icons = opts.icons or options.icons,
    collapsed_lines = opts.collapsed_lines or options.card.collapsed_lines,
    bang_lines = opts.bang_lines or options.card.bang_lines,
    -- false: the cursor is not in the card, so its keys do not work where the user is; hints
    -- then name commands (nil: rendered for a focused card)
    unfocused = opts.focused == false,
    id = opts.id,
    lines = {},
    highlights = {},
    styles = {},
    links = {},
    expandable = false,
  }
  H.header(ctx)
  H.rescued(ctx)
  if state.origin == 'bang' then
    H.bang_body(ctx)
  else
    H.tool_body(ctx)
  end
  H.changes(ctx)
  H.indexing(ctx)
  local height = 0
  for _, l in ipairs(ctx.lines) do
    height = height + M.rows(l, ctx.width)
  end
  return {
    lines = ctx.lines,
    highlights = ctx.highlights,
    styles = ctx.styles,
    title = H.title(ctx),
    footer = H.footer(ctx),
    height = height,
    expandable = ctx.expandable,
    can_load_full = H.can_load_full(state),
    links = ctx.links,
  }
end

--- The artifact line a card row points at (a rescued line), or nil.
---@param rendered agent_bash.Rendered
---@param row integer 0-based row in the card buffer
---@return string? url `artifact://<id>#L<n>`
function M.link_at(rendered, row)
  local link = rendered.links and rendered.links[row]
  return link and ('artifact://%d#L%d'):format(link[1], link[2]) or nil
end

--- The status a finished result means.
---@param result agent_bash.BashResult
---@return agent_bash.Status
function M.status_of(result)
  if result.timed_out then
    return 'timed_out'
  elseif result.cancelled then
    return 'cancelled'
  elseif result.is_error or (result.exit_code ~= nil and result.exit_code ~= 0) then
    return 'error'
  end
  return 'done'
end

--- Clamps a line to 4000 characters plus `… [<K> chars omitted]` (characters, not bytes).
--- A line the backend already clamped is returned unchanged.
---@param line string
---@return string
function M.clamp(line)
  if #line <= M.MAX_LINE_CHARS then
    return line
  end
  local n = vim.fn.strchars(line)
  if n <= M.MAX_LINE_CHARS then
    return line
  end
  local head = vim.fn.strcharpart(line, 0, M.MAX_LINE_CHARS)
  if line:sub(#head + 1):match('^… %[%d+ chars omitted%]$') then
    return line
  end
  return ('%s… [%d chars omitted]'):format(head, n - M.MAX_LINE_CHARS)
end

--- A byte count as people read it: `512B`, `50.0KB`, `1.0MB`, `2.5GB` (as the backend writes it).
---@param bytes integer
---@return string
function M.format_size(bytes)
  if bytes < 1024 then
    return ('%dB'):format(bytes)
  end
  local value = bytes / 1024
  for _, unit in ipairs({ 'KB', 'MB' }) do
    if value < 1023.95 then
      return ('%.1f%s'):format(value, unit)
    end
    value = value / 1024
  end
  return ('%.1fGB'):format(value)
end

--- A duration as people read it: `850ms`, `1.2s`, `2m05s`.
---@param ms integer
---@return string
function M.format_duration(ms)
  if ms < 1000 then
    return ('%dms'):format(ms)
  elseif ms < 60000 then
    return ('%.1fs'):format(ms / 1000)
  end
  return ('%dm%02ds'):format(math.floor(ms / 60000), math.floor(ms / 1000) % 60)
end

--- Splits a line into display rows of at most `width` cells: a list of {start, end} byte ranges
--- (0-based, end exclusive). Tabs stop every 8 cells from the row start.
---@param line string
---@param width integer
---@return {[1]: integer, [2]: integer}[]
function M.wrap(line, width)
  local n = #line
  if n <= width and not line:find('[\t\128-\255]') then
    return { { 0, n } }
  end
  local segs = {}
  if not line:find('[\t\128-\255]') then
    for s = 0, n - 1, width do
      segs[#segs + 1] = { s, math.min(s + width, n) }
    end
    return segs
  end
  local start, col, pos = 0, 0, 1
  while pos <= n do
    local b = line:byte(pos)
    local len = b < 0xC0 and 1 or b >= 0xF0 and 4 or b >= 0xE0 and 3 or 2
    local w
    if b == 9 then
      w = 8 - col % 8
    elseif b < 0x80 then
      w = 1
    else
      w = H.char_width(line:sub(pos, pos + len - 1))
    end
    if col + w > width and col > 0 then
      segs[#segs + 1] = { start, pos - 1 }
      start, col = pos - 1, 0
      if b == 9 then
        w = 8
      end
    end
    col = col + w
    pos = pos + len
  end
  segs[#segs + 1] = { start, n }
  return segs
end

--- Display rows a line takes at `width` (at least 1).
---@param line string
---@param width integer
---@return integer
function M.rows(line, width)
  if not line:find('[\t\128-\255]') then
    return math.max(1, math.ceil(#line / width))
  end
  return #M.wrap(line, width)
end

--- `$ cd <cwd> && ` label: cwd relative to `root` when inside it, as given otherwise, nil when
--- it is the root itself.
---@param cwd? string as the caller gave it
---@param root string project root (getcwd())
---@return string?
function M.cwd_label(cwd, root)
  if cwd == nil or cwd == '' or cwd == '.' or cwd == './' then
    return nil
  end
  local norm = function(p)
    p = p:gsub('/+$', '')
    return p == '' and '/' or p
  end
  local abs = cwd
  if not cwd:match('^[/~]') then
    abs = root .. '/' .. cwd
  elseif cwd:match('^~') then
    abs = (vim.env.HOME or '~') .. cwd:sub(2)
  end
  abs = norm(vim.fs.normalize(abs))
  root = norm(vim.fs.normalize(root))
  if abs == root then
    return nil
  end
  local prefix = root == '/' and '/' or root .. '/'
  if abs:sub(1, #prefix) == prefix then
    return abs:sub(#prefix + 1)
  end
  return cwd
end

--- Title and footer of a terminal float (contract §6): status icon, `$ <command>` cut to fit the
--- width, the status (exit N, cancelled, timed out) and the duration; the footer lists the keys
--- that work now (terminal mode while running, normal mode once done).
---@param state agent_bash.CardState
---@param opts {width: integer, focused?: boolean, keys?: agent_bash.Keys, term_kill_key?: string|false, icons?: table<agent_bash.Status, string>}
---@return [string, string][] title
---@return [string, string][] footer
function M.term_chrome(state, opts)
  local options = require('agent_bash.config').options
  local keys = opts.keys or options.keys
  local icons = opts.icons or options.icons
  local term_kill = opts.term_kill_key == nil and options.term_kill_key or opts.term_kill_key
  local title = H.title_chunks(state, opts.width, icons, function(g)
    return g
  end)
  -- Each part with its rank: when the footer is wider than the float, the lowest ranks go first
  -- (a part is dropped whole, never cut mid-word).
  local parts = {}
  if state.status == 'running' then
    if state.waiting_input then
      -- In the terminal itself the answer is typed there; from elsewhere, the command goes to it.
      parts[#parts + 1] = opts.focused and { 'waiting for input: type your answer', 5, 'waiting for input' }
        or { 'waiting for input: :AgentBashFocus to answer', 5, 'waiting for input: :AgentBashFocus' }
    end
    if state.cancel_requested then
      parts[#parts + 1] = { 'cancelling…', 4 }
    elseif term_kill then
      parts[#parts + 1] = { term_kill .. ' kill', 3 }
    end
    parts[#parts + 1] = { '<C-\\><C-n> normal mode', 1 }
  else
    parts[#parts + 1] = { keys.toggle .. ' card', 3 }
  end
  parts[#parts + 1] = { keys.close .. ' close', 2 }
  return title, { { H.fit_parts(parts, opts.width - 2), 'AgentBashFooter' } }
end

--- ` a · b · c ` from ranked parts, dropping the lowest-ranked ones until it fits `room`
--- columns; the highest-ranked part alone then takes its short form, and is cut with `…` when
--- even that does not fit.
---@param parts [string, integer, string?][]
---@param room integer
---@return string
function H.fit_parts(parts, room)
  local function text()
    return ' ' .. table.concat(vim.tbl_map(function(p)
      return p[1]
    end, parts), ' · ') .. ' '
  end
  while #parts > 1 and vim.fn.strwidth(text()) > room do
    local low = 1
    for i, p in ipairs(parts) do
      if p[2] < parts[low][2] then
        low = i
      end
    end
    table.remove(parts, low)
  end
  if vim.fn.strwidth(text()) > room and parts[1][3] then
    parts[1] = { parts[1][3], parts[1][2] }
  end
  local t = text()
  if vim.fn.strwidth(t) > room and room > 3 then
    t = ' ' .. vim.fn.strcharpart(parts[1][1], 0, room - 3) .. '… '
  end
  return t
end

-- Helpers -----------------------------------------------------------------------------------

H.width_cache = {}

function H.char_width(ch)
  local w = H.width_cache[ch]
  if not w then
    w = vim.fn.strwidth(ch)
    H.width_cache[ch] = w
  end
  return w
end

--- `Bash command failed: <message>`; a message of several lines (the backend's own text, such
--- as a settings file it refused) takes several card lines.
function H.add_error(ctx, message)
  for i, line in ipairs(vim.split(tostring(message), '\n', { plain = true })) do
    H.add(ctx, M.clamp(i == 1 and ('Bash command failed: ' .. line) or line), 'AgentBashError')
  end
end

function H.add(ctx, text, group)
  ctx.lines[#ctx.lines + 1] = text
  if group or ctx.state.exclude then
    ctx.highlights[#ctx.highlights + 1] = { #ctx.lines - 1, 0, #text, H.group(ctx, group) }
  end
end

--- Rescued lines (contract §7): the diagnostics the window cut off, above the output, each row
--- linked to its artifact line. Not once the full artifact is loaded: it holds them in place.
function H.rescued(ctx)
  local s = ctx.state
  local r = s.result
  if not r or type(r.rescued) ~= 'table' or #r.rescued == 0 or s.full_lines or not r.artifact_id then
    return
  end
  H.add(ctx, ('Earlier in the output (artifact://%d lines):'):format(r.artifact_id), 'AgentBashMore')
  for _, x in ipairs(r.rescued) do
    H.add(ctx, M.clamp(('%d: %s'):format(x.line, x.text)), 'AgentBashRescued')
    ctx.links[#ctx.lines - 1] = { r.artifact_id, x.line }
  end
  H.add(ctx, '…', 'AgentBashMore')
end

--- The files a finished run changed (contract §13), with the commands that show and undo them;
--- at most `card.changed_lines` names unless expanded.
function H.changes(ctx)
  local s = ctx.state
  local r = s.result
  if s.status == 'running' or not r or type(r.changes) ~= 'table' or #r.changes == 0 then
    return
  end
  local total = r.changes_count or #r.changes
  -- A mirrored MCP call's id belongs to its server (undo it there with `bash_undo`).
  local id = not s.client and r.changes_id or nil
  local head = id and ('Changed files (:AgentBashDiff %d, :AgentBashUndo %d):'):format(id, id) or 'Changed files:'
  H.add(ctx, head, 'AgentBashMore')
  local letters = require('agent_bash.changes').LETTER
  local limit = ctx.expanded and #r.changes or M.CHANGED_LINES
  for i, c in ipairs(r.changes) do
    if i > limit then
      break
    end
    H.add(ctx, M.clamp(('  %s %s'):format(letters[c.kind] or '?', c.path)))
  end
  local shown = math.min(limit, #r.changes)
  if total > shown then
    if shown < #r.changes then
      ctx.expandable = true
    end
    H.add(ctx, ('  … and %d more'):format(total - shown), 'AgentBashMore')
  end
end

--- A finished run with no receipt because its project's first snapshot was being taken
--- (`changes_indexing`, contract §13): how far the snapshot has got, as the backend says now
--- (`receipts`, set by `changes.follow`) or said when the run ended; at last, that receipts are
--- ready and start with the next run (or why they are off).
function H.indexing(ctx)
  local s = ctx.state
  local r = s.result
  if s.status == 'running' or not r or not r.changes_indexing then
    return
  end
  local p = s.receipts
  local text
  if not p then
    text = 'No receipt: ' .. tostring(r.changes_unavailable)
  elseif p.state == 'ready' then
    text = ('No receipt for this run; receipts are %s and start with the next run'):format(p.note)
  elseif p.state == 'off' then
    text = 'No receipt; receipts are ' .. p.note
  else
    text = 'No receipt: ' .. p.note
  end
  H.add(ctx, M.clamp(text), 'AgentBashMore')
end

--- Changed files a collapsed card names.
M.CHANGED_LINES = 5

--- Excluded bang commands draw everything dimmed.
function H.group(ctx, group)
  return ctx.state.exclude and 'AgentBashDim' or group
end

--- Where a remote run runs (contract §12): the host it reported, else its profile's name; nil for
--- this machine.
---@param state agent_bash.CardState
---@return string?
function M.host(state)
  local remote = state.result and state.result.remote
  if type(remote) == 'table' then
    return remote.host or remote.profile
  end
  if state.profile and state.profile ~= 'local' then
    return state.profile
  end
  return nil
end

function H.header(ctx)
  local s = ctx.state
  local cmd = s.cwd_label and ('cd %s && %s'):format(s.cwd_label, s.command) or s.command
  local host = M.host(s)
  local prompt = host and (host .. ':$ ') or '$ '
  local first = true
  for part in (cmd .. '\n'):gmatch('(.-)\n') do
    H.add(ctx, M.clamp((first and prompt or (' '):rep(vim.fn.strwidth(prompt))) .. part), 'AgentBashHeader')
    first = false
  end
end

--- Output lines: the artifact's text once loaded, else the display lines in hand.
---@return string[] lines, table<integer, agent_bash.HlSpan[]> spans, integer unseen
function H.source(ctx)
  local s = ctx.state
  if s.full_lines then
    return s.full_lines, {}, 0
  end
  local spans = {}
  if not s.exclude then
    for _, h in ipairs(s.hl or {}) do
      local row = h[1]
      spans[row] = spans[row] or {}
      table.insert(spans[row], h)
    end
  end
  return s.lines or {}, spans, math.max(0, (s.total_lines or 0) - #(s.lines or {}))
end

--- Appends source line `i` (1-based) whole, with its colour spans.
function H.add_source(ctx, lines, spans, i, group)
  local text = M.clamp(lines[i])
  H.add(ctx, text, group)
  H.add_spans(ctx, spans[i - 1], 0, #text)
end

--- Adds the colour spans falling in bytes [from, to) of a source line, shifted by -from.
function H.add_spans(ctx, list, from, to)
  if not list then
    return
  end
  local row = #ctx.lines - 1
  for _, h in ipairs(list) do
    local cs, ce = math.max(h[2], from), math.min(h[3], to)
    local group = ce > cs and require('agent_bash.highlight').style_group(h[4] or {})
    if group then
      ctx.styles[group] = h[4]
      ctx.highlights[#ctx.highlights + 1] = { row, cs - from, ce - from, group }
    end
  end
end

function H.tool_body(ctx)
  local s = ctx.state
  local r = s.result
  if r and r.blocked then
    for line in ((r.output or '') .. '\n'):gmatch('(.-)\n') do
      H.add(ctx, M.clamp(line), 'AgentBashWarning')
    end
    return
  end
  local lines, spans, unseen = H.source(ctx)
  if ctx.expanded then
    H.earlier(ctx, unseen)
    for i = 1, #lines do
      H.add_source(ctx, lines, spans, i)
    end
  else
    H.collapsed_rows(ctx, lines, spans, unseen)
  end
  if s.status ~= 'running' and s.status ~= 'failed' and #lines == 0 and unseen == 0 then
    H.add(ctx, '(no output)', 'AgentBashMore')
  end
  if s.error then
    H.add_error(ctx, s.error)
  end
  local warning = H.truncation_warning(s)
  if warning then
    H.add(ctx, '[' .. warning .. ']', 'AgentBashWarning')
  end
end

--- The last `collapsed_lines` display rows, after a `… (K earlier lines, …)` line when rows were
--- skipped (contract §8.1).
function H.collapsed_rows(ctx, lines, spans, unseen)
  local want, width = ctx.collapsed_lines, ctx.width
  local picked = {} -- {source index, seg} from the end
  local total = 0
  for i = #lines, 1, -1 do
    local text = M.clamp(lines[i])
    local segs = M.wrap(text, width)
    total = total + #segs
    for j = #segs, 1, -1 do
      if #picked >= want then
        break
      end
      picked[#picked + 1] = { i, segs[j], text }
    end
  end
  local shown = #picked
  -- The note counts what <Tab> shows; lines only the artifact holds are named after it.
  local skipped = total - shown
  local rest = H.rest_note(ctx, unseen)
  if skipped > 0 then
    ctx.expandable = true
    H.add(
      ctx,
      ('… (%d earlier lines, showing %d of %d) (%s to expand)'):format(skipped, shown, skipped + shown, ctx.keys.toggle)
        .. (rest and (', ' .. rest) or ''),
      'AgentBashMore'
    )
  elseif rest then
    H.add(ctx, '… ' .. rest, 'AgentBashMore')
  end
  for k = shown, 1, -1 do
    local i, seg, text = picked[k][1], picked[k][2], picked[k][3]
    H.add(ctx, text:sub(seg[1] + 1, seg[2]))
    H.add_spans(ctx, spans[i - 1], seg[1], seg[2])
  end
end

--- The lines before what the card holds, which <Tab> cannot show: `198000 earlier lines in
--- artifact://0 (o: full output)`; nil when there are none.
function H.rest_note(ctx, unseen)
  if unseen <= 0 then
    return nil
  end
  local id = ctx.state.result and ctx.state.result.artifact_id
  if id then
    return ('%d earlier lines in artifact://%d (%s: full output)'):format(unseen, id, ctx.keys.full_output)
  end
  return ('%d earlier lines not kept'):format(unseen)
end

--- In an expanded card, lines the backend no longer holds in its window.
function H.earlier(ctx, unseen)
  ctx.expandable = true
  if unseen > 0 then
    local id = ctx.state.result and ctx.state.result.artifact_id
    local text = id and ('… %d earlier lines (%s: full output)'):format(unseen, ctx.keys.full_output)
      or ('… %d earlier lines'):format(unseen)
    H.add(ctx, text, 'AgentBashMore')
  end
end

function H.bang_body(ctx)
  local s = ctx.state
  local r = s.result
  local lines, spans, unseen = H.source(ctx)
  local first = 1
  if ctx.expanded then
    H.earlier(ctx, unseen)
  else
    first = math.max(1, #lines - ctx.bang_lines + 1)
  end
  -- The note stands where the hidden lines are (above the tail) and counts only what <Tab>
  -- shows; lines only the artifact holds are named apart, with the key that loads them.
  if not ctx.expanded and s.status ~= 'running' then
    local rest = H.rest_note(ctx, unseen)
    if first > 1 then
      ctx.expandable = true
      H.add(
        ctx,
        ('… %d more lines (%s to expand)'):format(first - 1, ctx.keys.toggle) .. (rest and (', ' .. rest) or ''),
        'AgentBashMore'
      )
    elseif rest then
      H.add(ctx, '… ' .. rest, 'AgentBashMore')
    end
  end
  for i = first, #lines do
    H.add_source(ctx, lines, spans, i)
  end
  if s.status == 'running' then
    local cancel = s.cancel_requested and 'Cancelling…'
      or ctx.kill_key and not ctx.unfocused and ('Running… (%s to cancel)'):format(ctx.kill_key)
      or ('Running… (:AgentBashCancel%s to cancel)'):format(ctx.id and (' ' .. ctx.id) or '')
    if s.waiting_input and not s.cancel_requested then
      cancel = 'Waiting for input (:AgentBashFocus to answer)'
    end
    H.add(ctx, cancel, 'AgentBashRunning')
    return
  end
  if s.error then
    H.add_error(ctx, s.error)
  elseif r then
    if r.timed_out then
      H.add(ctx, '(timed out)', 'AgentBashWarning')
    elseif r.cancelled then
      H.add(ctx, '(cancelled)', 'AgentBashWarning')
    elseif r.exit_code == nil then
      H.add(ctx, '(missing exit status)', 'AgentBashError')
    elseif r.exit_code ~= 0 then
      H.add(ctx, ('(exit %d)'):format(r.exit_code), 'AgentBashError')
    end
  end
  local warning = H.truncation_warning(s)
  if warning then
    H.add(ctx, warning, 'AgentBashWarning')
  end
end

--- `Full output: artifact://<id>. Truncated: <L> lines shown (<size> limit)`, or nil when the
--- result is not truncated or the artifact is already loaded.
function H.truncation_warning(s)
  local r = s.result
  if not r or not r.truncated or s.full_lines then
    return nil
  end
  local tr = r.truncation or {}
  local limit = tr.truncated_by == 'lines' and tr.limit_lines and ('%d lines'):format(tr.limit_lines)
    or M.format_size(tr.limit_bytes or M.DEFAULT_LIMIT_BYTES)
  local tail = ('Truncated: %d lines shown (%s limit)'):format(r.output_lines or 0, limit)
  if r.artifact_id then
    return ('Full output: artifact://%d. %s'):format(r.artifact_id, tail)
  end
  return tail
end

function H.can_load_full(s)
  return s.result ~= nil and s.result.truncated == true and s.result.artifact_id ~= nil and not s.full_lines
end

H.status_group = {
  running = 'AgentBashRunning',
  done = 'AgentBashOk',
  error = 'AgentBashError',
  cancelled = 'AgentBashWarning',
  timed_out = 'AgentBashWarning',
  failed = 'AgentBashError',
}

--- Appends the words a title shows for the run's status (`running`, `waiting for input`,
--- `done`, `exit N`, `cancelled`, `timed out`, `failed`) and its elapsed time (ticking while it
--- runs, the duration once done) to {words}.
---@param state agent_bash.CardState
---@param words string[]
---@param now? integer vim.uv.now() for the elapsed time of a running command
---@return string[]
function M.status_words(state, words, now)
  words = words or {}
  local r = state.result
  if state.status == 'running' then
    words[#words + 1] = state.waiting_input and 'waiting for input' or 'running'
  elseif state.status == 'done' then
    words[#words + 1] = 'done'
  elseif state.status == 'error' then
    words[#words + 1] = r and r.exit_code ~= nil and ('exit %d'):format(r.exit_code) or 'missing exit status'
  elseif state.status == 'cancelled' then
    words[#words + 1] = 'cancelled'
  elseif state.status == 'timed_out' then
    words[#words + 1] = 'timed out'
  elseif state.status == 'failed' then
    words[#words + 1] = 'failed'
  end
  if r and r.duration_ms then
    words[#words + 1] = M.format_duration(r.duration_ms)
  elseif state.status == 'running' and state.started_at then
    words[#words + 1] = M.format_elapsed((now or vim.uv.now()) - state.started_at)
  end
  return words
end

--- Elapsed time of a running command, in whole seconds: `0s`, `42s`, `2m05s`.
---@param ms integer
---@return string
function M.format_elapsed(ms)
  local secs = math.max(0, math.floor(ms / 1000))
  if secs < 60 then
    return ('%ds'):format(secs)
  end
  return ('%dm%02ds'):format(math.floor(secs / 60), secs % 60)
end

--- Title chunks: status icon, then `$ <command> · <status> · <elapsed>` with the command cut to
--- fit `width`.
---@param state agent_bash.CardState
---@param width integer
---@param icons table<agent_bash.Status, string>
---@param group fun(g: string): string
function H.title_chunks(state, width, icons, group)
  local words = M.status_words(state, {})
  if state.client then
    table.insert(words, 1, ('bash (%s)'):format(state.client)) -- a call an MCP client made (the editor mirror)
  end
  if state.exclude then
    words[#words + 1] = 'not in context'
  end
  local icon = ' ' .. (icons[state.status] or '?') .. ' '
  local tail = #words > 0 and (' · ' .. table.concat(words, ' · ')) or ''
  local room = math.max(8, width - vim.fn.strwidth(icon) - vim.fn.strwidth(tail) - 3)
  local host = M.host(state)
  local cmd = (host and (host .. ':$ ') or '$ ') .. (state.command:match('^[^\n]*') or '')
  if vim.fn.strwidth(cmd) > room or state.command:find('\n') then
    cmd = vim.fn.strcharpart(cmd, 0, room - 1) .. '…'
  end
  return {
    { icon, group(H.status_group[state.status] or 'AgentBashTitle') },
    { cmd .. tail .. ' ', group('AgentBashTitle') },
  }
end

--- The title chunks of a card for `state` at `width` (what `render` puts in `title`).
---@param state agent_bash.CardState
---@param width integer
---@return [string, string][]
function M.title(state, width)
  local icons = require('agent_bash.config').options.icons
  return H.title_chunks(state, width, icons, function(g)
    return state.exclude and 'AgentBashDim' or g
  end)
end

function H.title(ctx)
  return H.title_chunks(ctx.state, ctx.width, ctx.icons, function(g)
    return H.group(ctx, g)
  end)
end

function H.footer(ctx)
  local s = ctx.state
  local parts = {}
  if s.timeout then
    -- the backend clamps timeouts to [1, 3600] s (contract §3): show the one that applies
    parts[#parts + 1] = ('[Timeout: %ss]'):format(H.number(math.min(3600, math.max(1, s.timeout))))
  end
  local receipt = M.receipt(s.result)
  if receipt then
    parts[#parts + 1] = receipt
  end
  if ctx.unfocused then
    -- The card's own keys work only inside it: say how to get there, and what works from here.
    local id = ctx.id and (' ' .. ctx.id) or ''
    local map = M.plug_lhs('AgentBashFocus')
    parts[#parts + 1] = map and (map .. ' focus') or (':AgentBashFocus' .. id)
    if s.status == 'running' and not s.cancel_requested then
      parts[#parts + 1] = ':AgentBashCancel' .. id
    elseif s.status ~= 'running' then
      parts[#parts + 1] = ':AgentBashClose' .. id
    end
    return { { ' ' .. table.concat(parts, ' · ') .. ' ', 'AgentBashFooter' } }
  end
  if s.status == 'running' and ctx.kill_key and not s.cancel_requested then
    parts[#parts + 1] = ctx.kill_key .. ' cancel'
  end
  if ctx.expandable or ctx.expanded then
    parts[#parts + 1] = ctx.keys.toggle .. (ctx.expanded and ' collapse' or ' expand')
  end
  if H.can_load_full(s) then
    parts[#parts + 1] = ctx.keys.full_output .. ' full output'
  end
  if s.status ~= 'running' then
    parts[#parts + 1] = ctx.keys.yank .. ' yank'
    parts[#parts + 1] = ctx.keys.split .. ' split'
  end
  parts[#parts + 1] = ctx.keys.close .. ' close'
  return { { ' ' .. table.concat(parts, ' · ') .. ' ', 'AgentBashFooter' } }
end

--- The user's normal-mode mapping of `<Plug>(<name>)`, if any (its lhs as `:map` shows it).
---@param name string
---@return string?
function M.plug_lhs(name)
  local rhs = '<Plug>(' .. name .. ')'
  for _, m in ipairs(vim.api.nvim_get_keymap('n')) do
    if m.rhs == rhs then
      return m.lhsraw and vim.fn.keytrans(m.lhsraw) or m.lhs
    end
  end
end

--- What a finished run cost (contract §7 receipt), as the footer shows it: `2.0 s CPU, 210 MiB`;
--- nil when the backend could not tell, or when the run was cheap (under 1 s of CPU and
--- 100 MiB): a footer on every `ls` saying `0.0 s CPU` would be noise.
---@param result? agent_bash.BashResult
---@return string?
function M.receipt(result)
  local r = result and result.resources
  if type(r) ~= 'table' then
    return nil
  end
  local cpu = (r.cpu_user_ms or 0) + (r.cpu_sys_ms or 0)
  if cpu < 1000 and (r.max_rss_kib or 0) < 102400 then
    return nil
  end
  local parts = {}
  if r.cpu_user_ms and r.cpu_sys_ms then
    parts[#parts + 1] = ('%.1f s CPU'):format((r.cpu_user_ms + r.cpu_sys_ms) / 1000)
  end
  local kib = r.max_rss_kib
  if kib then
    if kib >= 1048576 then
      parts[#parts + 1] = ('%.1f GiB'):format(kib / 1048576)
    elseif kib >= 1024 then
      parts[#parts + 1] = ('%d MiB'):format(math.floor(kib / 1024))
    else
      parts[#parts + 1] = ('%d KiB'):format(kib)
    end
  end
  return #parts > 0 and table.concat(parts, ', ') or nil
end

--- 30 → "30", 1.5 → "1.5".
function H.number(n)
  if n == math.floor(n) then
    return ('%d'):format(n)
  end
  return (('%.3f'):format(n):gsub('0+$', ''))
end

return M
