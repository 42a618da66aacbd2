-- Cards (SPEC §8.1 tool call, §8.2 bang command), rendered as data: state + width → lines,
-- highlights, title and footer. No window or buffer calls here; float.lua places the result.

local M = {}
local H = {}

M.MAX_LINE_CHARS = 4000 -- SPEC §8.2: each line clamped to 4000 characters
M.DEFAULT_LIMIT_BYTES = 51200 -- the sink's window (SPEC §4.2) when the backend does not say

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
    lines = {},
    highlights = {},
    styles = {},
    expandable = false,
  }
  H.header(ctx)
  if state.origin == 'bang' then
    H.bang_body(ctx)
  else
    H.tool_body(ctx)
  end
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
  }
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

--- Title and footer of a terminal float (SPEC §6): status icon, `$ <command>` cut to fit the
--- width, the status (exit N, cancelled, timed out) and the duration; the footer lists the keys
--- that work now (terminal mode while running, normal mode once done).
---@param state agent_bash.CardState
---@param opts {width: integer, keys?: agent_bash.Keys, kill_key?: string|false, icons?: table<agent_bash.Status, string>}
---@return [string, string][] title
---@return [string, string][] footer
function M.term_chrome(state, opts)
  local options = require('agent_bash.config').options
  local keys = opts.keys or options.keys
  local kill_key = opts.kill_key == nil and options.kill_key or opts.kill_key
  local icons = opts.icons or options.icons
  local suffix = H.status_words(state, {})
  local icon = ' ' .. (icons[state.status] or '?') .. ' '
  local tail = #suffix > 0 and (' · ' .. table.concat(suffix, ' · ')) or ''
  local room = math.max(8, opts.width - vim.fn.strwidth(icon) - vim.fn.strwidth(tail) - 3)
  local cmd = '$ ' .. (state.command:match('^[^\n]*') or '')
  if vim.fn.strwidth(cmd) > room or state.command:find('\n') then
    cmd = vim.fn.strcharpart(cmd, 0, room - 1) .. '…'
  end
  local title = {
    { icon, H.status_group[state.status] or 'AgentBashTitle' },
    { cmd .. tail .. ' ', 'AgentBashTitle' },
  }
  local parts = {}
  if state.status == 'running' then
    if state.cancel_requested then
      parts[#parts + 1] = 'cancelling…'
    elseif kill_key then
      parts[#parts + 1] = kill_key .. ' kill'
    end
    parts[#parts + 1] = '<C-\\><C-n> normal mode'
  else
    parts[#parts + 1] = keys.toggle .. ' card'
  end
  parts[#parts + 1] = keys.close .. ' close'
  return title, { { ' ' .. table.concat(parts, ' · ') .. ' ', 'AgentBashFooter' } }
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

function H.add(ctx, text, group)
  ctx.lines[#ctx.lines + 1] = text
  if group or ctx.state.exclude then
    ctx.highlights[#ctx.highlights + 1] = { #ctx.lines - 1, 0, #text, H.group(ctx, group) }
  end
end

--- Excluded bang commands draw everything dimmed.
function H.group(ctx, group)
  return ctx.state.exclude and 'AgentBashDim' or group
end

function H.header(ctx)
  local s = ctx.state
  local cmd = s.cwd_label and ('cd %s && %s'):format(s.cwd_label, s.command) or s.command
  local first = true
  for part in (cmd .. '\n'):gmatch('(.-)\n') do
    H.add(ctx, M.clamp((first and '$ ' or '  ') .. part), 'AgentBashHeader')
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
    H.add(ctx, 'Bash command failed: ' .. s.error, 'AgentBashError')
  end
  local warning = H.truncation_warning(s)
  if warning then
    H.add(ctx, '[' .. warning .. ']', 'AgentBashWarning')
  end
end

--- The last `collapsed_lines` display rows, after a `… (K earlier lines, …)` line when rows were
--- skipped (SPEC §8.1).
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
  local skipped = total - shown + unseen
  if skipped > 0 then
    ctx.expandable = true
    H.add(
      ctx,
      ('… (%d earlier lines, showing %d of %d) (%s to expand)'):format(skipped, shown, skipped + shown, ctx.keys.toggle),
      'AgentBashMore'
    )
  end
  for k = shown, 1, -1 do
    local i, seg, text = picked[k][1], picked[k][2], picked[k][3]
    H.add(ctx, text:sub(seg[1] + 1, seg[2]))
    H.add_spans(ctx, spans[i - 1], seg[1], seg[2])
  end
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
  for i = first, #lines do
    H.add_source(ctx, lines, spans, i)
  end
  local hidden = (first - 1) + unseen
  if s.status == 'running' then
    local cancel = s.cancel_requested and 'Cancelling…'
      or ctx.kill_key and ('Running… (%s to cancel)'):format(ctx.kill_key)
      or 'Running… (:AgentBashCancel to cancel)'
    H.add(ctx, cancel, 'AgentBashRunning')
    return
  end
  if hidden > 0 and not ctx.expanded then
    ctx.expandable = true
    H.add(ctx, ('… %d more lines (%s to expand)'):format(hidden, ctx.keys.toggle), 'AgentBashMore')
  end
  if s.error then
    H.add(ctx, 'Bash command failed: ' .. s.error, 'AgentBashError')
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

--- Appends the words a title shows for the run's status (`exit N`, `cancelled`, `timed out`,
--- `failed`) and its duration to {words}.
---@param state agent_bash.CardState
---@param words string[]
---@return string[]
function H.status_words(state, words)
  local r = state.result
  if state.status == 'error' then
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
  end
  return words
end

function H.title(ctx)
  local s = ctx.state
  local name = s.origin == 'bang' and (s.exclude and 'AgentBash! (not in context)' or 'AgentBash') or 'bash'
  local parts = H.status_words(s, { name })
  return {
    { ' ' .. (ctx.icons[s.status] or '?') .. ' ', H.group(ctx, H.status_group[s.status] or 'AgentBashTitle') },
    { table.concat(parts, ' · ') .. ' ', H.group(ctx, 'AgentBashTitle') },
  }
end

function H.footer(ctx)
  local s = ctx.state
  local parts = {}
  if s.timeout then
    -- the backend clamps timeouts to [1, 3600] s (SPEC §3): show the one that applies
    parts[#parts + 1] = ('[Timeout: %ss]'):format(H.number(math.min(3600, math.max(1, s.timeout))))
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
  parts[#parts + 1] = ctx.keys.close .. ' close'
  return { { ' ' .. table.concat(parts, ' · ') .. ' ', 'AgentBashFooter' } }
end

--- 30 → "30", 1.5 → "1.5".
function H.number(n)
  if n == math.floor(n) then
    return ('%d'):format(n)
  end
  return (('%.3f'):format(n):gsub('0+$', ''))
end

return M
