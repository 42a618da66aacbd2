-- Context for agents (context.lua: the busy queue, on_context, take_pending) and the history
-- picker (history.lua), with the backend's requests stubbed: `get_context` answers from a list
-- the tests append to, as the real backend's record would grow.
local t = ...

local ab = require('agent_bash')
local backend = require('agent_bash.backend')
local runs = require('agent_bash.runs')
local history = require('agent_bash.history')
vim.o.lines, vim.o.columns = 40, 120

local record = {} -- what get_context answers
local entries = {} -- what history answers
local requests = {}
--- A page of `list` as the backend answers it (offset nil: the last page).
local function page(list, params)
  local limit = math.min(params.limit or 50, 200)
  local offset = params.offset or math.max(0, #list - limit)
  return vim.list_slice(vim.deepcopy(list), offset + 1, offset + limit), math.min(offset, #list)
end

local asked = {} -- params of each request
backend.request = function(method, params)
  requests[#requests + 1] = method
  asked[#asked + 1] = params
  if method == 'get_context' then
    local items, offset = page(record, params)
    return true, { messages = items, offset = offset, total = #record }
  elseif method == 'history' then
    local items, offset = page(entries, params)
    return true, { runs = items, offset = offset, total = #entries }
  end
  return false, 'unknown ' .. method
end
backend.notify = function()
  return true
end

local notes = {}
vim.notify = function(msg, level)
  notes[#notes + 1] = { msg, level }
end

--- Runs a bang command to its end; `recorded` is the message the backend records (nil when
--- excluded).
local function bang(cmd, opts)
  opts = opts or {}
  local id = ab.run(cmd, { exclude = opts.exclude })
  if not opts.exclude then
    record[#record + 1] = { role = 'user', content = ('Ran `%s`\n```\n(no output)\n```'):format(cmd) }
  end
  runs.on_event({ type = 'done', id = id, lines = {}, hl = {}, result = { exit_code = 0, total_lines = 0 } })
  ab.close_all()
end

local function contents(list)
  return vim.tbl_map(function(m)
    return m.content
  end, list)
end

t.describe('context', function()
  local got = {}

  t.it('context() is the backend answer', function()
    record = { { role = 'user', content = 'Ran `x`' } }
    t.eq({ { role = 'user', content = 'Ran `x`' } }, ab.context())
    record = {}
  end)

  t.it('without a hook, messages wait for take_pending', function()
    bang('a')
    t.eq({ 'Ran `a`\n```\n(no output)\n```' }, contents(ab.take_pending()))
    t.eq({}, ab.take_pending(), 'take_pending empties the queue')
  end)

  t.it('idle: the hook gets each message at once', function()
    ab.on_context(function(msg)
      got[#got + 1] = msg
    end)
    bang('b')
    t.eq({ { role = 'user', content = 'Ran `b`\n```\n(no output)\n```' } }, got)
    t.eq({}, ab.take_pending())
  end)

  t.it('busy: messages are queued, in order, until taken', function()
    got = {}
    ab.set_agent_busy(true)
    bang('c')
    bang('d')
    t.eq({}, got)
    ab.set_agent_busy(false)
    t.eq({}, got, 'going idle does not deliver: the agent takes them before its next prompt')
    t.eq({ 'Ran `c`\n```\n(no output)\n```', 'Ran `d`\n```\n(no output)\n```' }, contents(ab.take_pending()))
  end)

  t.it('idle again with a queue: queued messages reach the hook before the new one', function()
    got = {}
    ab.set_agent_busy(true)
    bang('e')
    ab.set_agent_busy(false)
    bang('f')
    t.eq({ 'Ran `e`\n```\n(no output)\n```', 'Ran `f`\n```\n(no output)\n```' }, contents(got))
  end)

  t.it('excluded commands are never delivered nor queued', function()
    got, requests = {}, {}
    bang('secret', { exclude = true })
    t.eq({}, got)
    t.eq({}, requests, 'no need to ask the backend')
    ab.set_agent_busy(true)
    bang('secret2', { exclude = true })
    ab.set_agent_busy(false)
    t.eq({}, ab.take_pending())
  end)

  t.it('failed runs and tool calls deliver nothing', function()
    got, requests = {}, {}
    local id = ab.run('badcwd')
    runs.on_event({ type = 'error', id = id, message = 'Working directory does not exist: /nope' })
    ab.tool_call({ command = 'ls' }, { on_done = function() end })
    runs.on_event({ type = 'done', id = id + 1, lines = {}, hl = {}, result = { exit_code = 0 } })
    t.eq({}, got)
    t.eq({}, requests)
    ab.close_all()
  end)

  t.it('a failing hook is reported, later messages still arrive', function()
    ab.on_context(function(msg)
      if msg.content:find('boom') then
        error('hook broke')
      end
      got[#got + 1] = msg
    end)
    got, notes = {}, {}
    bang('boom')
    t.eq(vim.log.levels.ERROR, notes[1][2])
    t.ok(notes[1][1]:find('on_context hook failed', 1, true), notes[1][1])
    bang('g')
    t.eq({ 'Ran `g`\n```\n(no output)\n```' }, contents(got))
    ab.on_context(nil)
  end)

  t.it('a finished bang command asks only for the messages past the cursor', function()
    ab.take_pending()
    for i = 1, 300 do -- a long session, recorded before this editor looked
      record[#record + 1] = { role = 'user', content = 'old ' .. i }
    end
    asked = {}
    bang('echo one')
    -- Paged from the cursor: every page holds only new messages, and the old ones come once.
    local offsets = vim.tbl_map(function(p)
      return p.offset
    end, asked)
    t.eq({ #record - 301, #record - 101 }, offsets)
    local got = ab.take_pending()
    t.eq(301, #got)
    t.eq('Ran `echo one`\n```\n(no output)\n```', got[#got].content)
    asked = {}
    bang('echo two')
    t.eq({ { offset = #record - 1, limit = 200 } }, asked)
    t.eq({ 'Ran `echo two`\n```\n(no output)\n```' }, contents(ab.take_pending()))
  end)

  t.it('context() and history() are paged', function()
    local msgs, err, total = ab.context({ offset = 1, limit = 2 })
    t.eq(nil, err)
    t.eq(#record, total)
    t.eq({ record[2].content, record[3].content }, contents(msgs))
    msgs = ab.context({ limit = 1 })
    t.eq({ record[#record].content }, contents(msgs))
    t.raises(function()
      ab.context({ offset = 'x' })
    end, 'opts.offset')
  end)

  t.it('validates its arguments', function()
    t.raises(function()
      ab.set_agent_busy('yes')
    end, 'busy: expected boolean')
    t.raises(function()
      ab.on_context(42)
    end, 'fn: expected callable')
  end)
end)

local function entry(over)
  local e = {
    role = 'bashExecution',
    command = 'make test',
    output = 'ok\n',
    exit_code = 0,
    cancelled = false,
    truncated = false,
    meta = { cwd = '/p', timed_out = false, duration_ms = 1234, total_lines = 1, total_bytes = 3, output_lines = 1 },
    timestamp = 1700000000000,
    exclude_from_context = false,
  }
  return vim.tbl_deep_extend('force', e, over or {})
end

t.describe('history', function()
  local time = os.date('%H:%M:%S', 1700000000)

  t.it('formats items: command, status, duration, lines, artifact', function()
    t.eq(time .. ' $ make test · ok · 1.2s · 1 line', history.format(entry()))
    t.eq(
      time .. ' $ false · exit 1 · 3ms · 0 lines',
      history.format(entry({ command = 'false', exit_code = 1, meta = { duration_ms = 3, total_lines = 0 } }))
    )
    t.eq(
      time .. ' $ sleep 9 · cancelled · 1.2s · 1 line · not in context',
      history.format(entry({ command = 'sleep 9', cancelled = true, exit_code = nil, exclude_from_context = true }))
    )
    local timed = entry({ cancelled = true, meta = { timed_out = true, total_lines = 120000, artifact_id = 3 } })
    timed.exit_code = nil
    t.eq(time .. ' $ make test · timed out · 1.2s · 120000 lines · artifact://3', history.format(timed))
    t.eq(time .. ' $ for x in a b; do … · ok · 1.2s · 1 line', history.format(entry({ command = 'for x in a b; do\n  echo $x\ndone' })))
  end)

  t.it('reopens a finished card from the record', function()
    local e = entry({
      command = 'seq 100',
      output = 'line 99\nline 100\n',
      exit_code = 2,
      truncated = true,
      meta = { total_lines = 100, output_lines = 2, artifact_id = 7, notice = '[Showing lines 99-100 of 100 (1.0KB limit). Full: artifact://7]' },
    })
    local card = history.open_card(e)
    t.eq(card.win, vim.api.nvim_get_current_win())
    t.eq({
      '$ seq 100',
      '… 98 earlier lines in artifact://7 (o: full output)',
      'line 99',
      'line 100',
      '(exit 2)',
      'Full output: artifact://7. Truncated: 2 lines shown (1.0KB limit)',
    }, vim.api.nvim_buf_get_lines(card.buf, 0, -1, false))
    t.eq({ ' ✗ ', '$ seq 100 · exit 2 · 1.2s ' }, vim.tbl_map(function(c)
      return c[1]
    end, vim.api.nvim_win_get_config(card.win).title))
    ab.close_all()
  end)

  t.it('a recorded run cut by lines says so; its receipt is in the footer', function()
    local e = entry({
      command = 'seq 3000',
      output = '3000\n',
      truncated = true,
      meta = {
        total_lines = 3000,
        output_lines = 1,
        artifact_id = 2,
        notice = '[Showing lines 1001-3000 of 3000 (2000 lines limit). Full: artifact://2]',
        resources = { wall_ms = 30, cpu_user_ms = 10, cpu_sys_ms = 0, max_rss_kib = 2048 },
      },
    })
    local state = history.card_state(e)
    t.eq({ truncated_by = 'lines', limit_lines = 2000 }, state.result.truncation)
    t.eq(2048, state.result.resources.max_rss_kib)
  end)

  t.it(':AgentBashHistory lists newest first, then offers the card or the artifact', function()
    entries = { entry({ command = 'first' }), entry({ command = 'second', meta = { artifact_id = 4 } }) }
    local asked = {}
    local answers = {}
    vim.ui.select = function(items, opts, on_choice)
      asked[#asked + 1] = { items = items, opts = opts }
      local pick = table.remove(answers, 1)
      on_choice(items[pick], pick)
    end
    answers = { 1, 2 }
    local edited
    local edit = vim.cmd.edit
    vim.cmd.edit = function(arg)
      edited = arg
    end
    vim.cmd('AgentBashHistory')
    vim.cmd.edit = edit
    t.eq({ 'second', 'first' }, vim.tbl_map(function(e)
      return e.command
    end, asked[1].items))
    t.eq(history.format, asked[1].opts.format_item)
    t.eq({ 'Reopen the card', 'Open artifact://4' }, asked[2].items)
    t.eq('artifact://4', edited)
    -- no artifact: the card at once
    asked, answers = {}, { 2 }
    vim.cmd('AgentBashHistory')
    t.eq(1, #asked)
    t.eq('$ first', vim.api.nvim_buf_get_lines(0, 0, 1, false)[1])
    ab.close_all()
  end)

  t.it('says so when nothing is recorded', function()
    entries, notes = {}, {}
    vim.cmd('AgentBashHistory')
    t.eq({ { 'agent-bash: no commands recorded in this session yet', vim.log.levels.INFO } }, notes)
  end)
end)
