-- card.lua: whole rendered cards (contract §8.1, §8.2).
local t = ...
local card = require('agent_bash.card')

local W = 40

local function numbered(n, from)
  local lines = {}
  for i = 1, n do
    lines[i] = 'line ' .. ((from or 1) + i - 1)
  end
  return lines
end

---@return agent_bash.BashResult
local function result(over)
  return vim.tbl_extend('force', {
    output = '',
    exit_code = 0,
    cancelled = false,
    timed_out = false,
    truncated = false,
    total_lines = 0,
    total_bytes = 0,
    output_lines = 0,
    output_bytes = 0,
    duration_ms = 12,
    is_error = false,
  }, over or {})
end

local function tool(over)
  return vim.tbl_extend('force', { origin = 'tool', command = 'make test', status = 'running', lines = {}, hl = {}, total_lines = 0 }, over or {})
end

local function bang(over)
  return vim.tbl_extend('force', { origin = 'bang', command = 'ls -la', status = 'running', lines = {}, hl = {}, total_lines = 0 }, over or {})
end

local function render(state, expanded, width)
  return card.render(state, { width = width or W, expanded = expanded or false })
end

local function done(state, r)
  state.result = result(r)
  state.status = card.status_of(state.result)
  state.total_lines = state.result.total_lines
  return state
end

t.describe('tool card', function()
  t.it('running without output', function()
    local r = render(tool())
    t.eq({ '$ make test' }, r.lines)
    t.eq({ { ' ● ', 'AgentBashRunning' }, { '$ make test · running ', 'AgentBashTitle' } }, r.title)
    t.eq({ { ' <Esc> cancel · q close ', 'AgentBashFooter' } }, r.footer)
    t.eq({ { 0, 0, 11, 'AgentBashHeader' } }, r.highlights)
    t.eq(1, r.height)
  end)

  t.it('running, collapsed to the last 10 display lines', function()
    local r = render(tool({ lines = numbered(15), total_lines = 15 }))
    t.eq({
      '$ make test',
      '… (5 earlier lines, showing 10 of 15) (<Tab> to expand)',
      'line 6',
      'line 7',
      'line 8',
      'line 9',
      'line 10',
      'line 11',
      'line 12',
      'line 13',
      'line 14',
      'line 15',
    }, r.lines)
    t.eq({ { ' <Esc> cancel · <Tab> expand · q close ', 'AgentBashFooter' } }, r.footer)
  end)

  t.it('counts what <Tab> shows, then the lines the backend no longer sends', function()
    local r = render(tool({ lines = numbered(12, 989), total_lines = 1000 }))
    t.eq('… (2 earlier lines, showing 10 of 12) (<Tab> to expand), 988 earlier lines not kept', r.lines[2])
    t.eq('line 1000', r.lines[12])
  end)

  t.it('collapsed wraps to the width and keeps the last display rows', function()
    local long = ('abcdefghij'):rep(5) -- 50 chars: 5 rows at width 10
    local r = card.render(tool({ lines = { 'first', long }, total_lines = 2 }), { width = 10, expanded = false, collapsed_lines = 3 })
    t.eq({ '$ make tes', '… (3 earlier lines, showing 3 of 6) (<Tab> to expand)', 'abcdefghij', 'abcdefghij', 'abcdefghij' }, {
      r.lines[1]:sub(1, 10),
      r.lines[2],
      r.lines[3],
      r.lines[4],
      r.lines[5],
    })
    t.eq(5, #r.lines)
  end)

  t.it('expanded shows every retained line, unwrapped', function()
    local long = ('abcdefghij'):rep(5)
    local state = done(tool({ lines = { 'first', long } }), { total_lines = 2, output_lines = 2 })
    local r = card.render(state, { width = 10, expanded = true, collapsed_lines = 3 })
    t.eq({ '$ make test', 'first', long }, r.lines)
    t.eq({ { ' <Tab> collapse · y yank · <C-s> split · q close ', 'AgentBashFooter' } }, r.footer)
    t.eq(2 + 1 + 5, r.height) -- header wraps to 2 rows at width 10
  end)

  t.it('success', function()
    local r = render(done(tool({ lines = { 'ok' } }), { total_lines = 1, output_lines = 1 }))
    t.eq({ '$ make test', 'ok' }, r.lines)
    t.eq({ { ' ✓ ', 'AgentBashOk' }, { '$ make test · done · 12ms ', 'AgentBashTitle' } }, r.title)
    t.eq({ { ' y yank · <C-s> split · q close ', 'AgentBashFooter' } }, r.footer)
  end)

  t.it('no output', function()
    local r = render(done(tool(), {}))
    t.eq({ '$ make test', '(no output)' }, r.lines)
  end)

  t.it('non-zero exit', function()
    local r = render(done(tool({ lines = { 'boom' } }), { exit_code = 2, is_error = true, total_lines = 1, duration_ms = 1500 }))
    t.eq({ '$ make test', 'boom' }, r.lines)
    t.eq({ { ' ✗ ', 'AgentBashError' }, { '$ make test · exit 2 · 1.5s ', 'AgentBashTitle' } }, r.title)
  end)

  t.it('timeout shows the footer and the timed-out status', function()
    local state = tool({ timeout = 2, lines = { 'tick' } })
    done(state, { exit_code = nil, cancelled = true, timed_out = true, is_error = true, total_lines = 1, duration_ms = 2003 })
    local r = render(state)
    t.eq({ '$ make test', 'tick' }, r.lines)
    t.eq({ { ' ◷ ', 'AgentBashWarning' }, { '$ make test · timed out · 2.0s ', 'AgentBashTitle' } }, r.title)
    t.eq({ { ' [Timeout: 2s] · y yank · <C-s> split · q close ', 'AgentBashFooter' } }, r.footer)
  end)

  t.it('fractional timeout', function()
    t.eq({ { ' [Timeout: 1.5s] · <Esc> cancel · q close ', 'AgentBashFooter' } }, render(tool({ timeout = 1.5 })).footer)
  end)

  t.it('cancelled', function()
    local state = done(tool({ lines = { 'a' } }), { exit_code = nil, cancelled = true, is_error = true, total_lines = 1 })
    t.eq('cancelled', state.status)
    t.eq({ { ' ⊘ ', 'AgentBashWarning' }, { '$ make test · cancelled · 12ms ', 'AgentBashTitle' } }, render(state).title)
  end)

  t.it('cancel requested hides the cancel hint', function()
    t.eq({ { ' q close ', 'AgentBashFooter' } }, render(tool({ cancel_requested = true })).footer)
  end)

  t.it('truncated: artifact link, then the full artifact replaces it', function()
    local state = tool({ lines = numbered(3, 98) })
    done(state, { total_lines = 100, output_lines = 3, truncated = true, artifact_id = 7, duration_ms = 5 })
    local r = render(state)
    t.eq({
      '$ make test',
      '… 97 earlier lines in artifact://7 (o: full output)',
      'line 98',
      'line 99',
      'line 100',
      '[Full output: artifact://7. Truncated: 3 lines shown (50.0KB limit)]',
    }, r.lines)
    t.eq({ { ' o full output · y yank · <C-s> split · q close ', 'AgentBashFooter' } }, r.footer, '<Tab> would show nothing more')
    t.ok(r.can_load_full)
    t.eq({
      '$ make test',
      '… 97 earlier lines (o: full output)',
      'line 98',
      'line 99',
      'line 100',
      '[Full output: artifact://7. Truncated: 3 lines shown (50.0KB limit)]',
    }, render(state, true).lines)
    state.full_lines = numbered(100)
    r = render(state, true)
    t.eq(vim.list_extend({ '$ make test' }, numbered(100)), r.lines)
    t.eq({ { ' <Tab> collapse · y yank · <C-s> split · q close ', 'AgentBashFooter' } }, r.footer)
    t.ok(not r.can_load_full)
  end)

  t.it('truncation limit from the backend', function()
    local state = done(tool({ lines = { 'x' } }), {
      total_lines = 9,
      output_lines = 1,
      truncated = true,
      artifact_id = 2,
      truncation = { direction = 'tail', truncated_by = 'bytes', shown_range = { start = 9, ['end'] = 9 }, limit_bytes = 1048576 },
    })
    t.eq('[Full output: artifact://2. Truncated: 1 lines shown (1.0MB limit)]', render(state).lines[4])
  end)

  t.it('truncation names the line limit when lines cut', function()
    local state = done(tool({ lines = { 'x' } }), {
      total_lines = 9,
      output_lines = 1,
      truncated = true,
      artifact_id = 2,
      truncation = {
        direction = 'tail',
        truncated_by = 'lines',
        shown_range = { start = 9, ['end'] = 9 },
        limit_bytes = 51200,
        limit_lines = 2000,
      },
    })
    t.eq('[Full output: artifact://2. Truncated: 1 lines shown (2000 lines limit)]', render(state).lines[4])
  end)

  t.it('rescued lines above the output, linked to their artifact lines', function()
    local state = done(tool({ lines = { 'tail 1', 'tail 2' } }), {
      total_lines = 5000,
      output_lines = 2,
      truncated = true,
      artifact_id = 3,
      rescued = { { line = 12, text = 'error[E0308]: mismatched types' }, { line = 13, text = ' --> src/main.rs:2:18' } },
    })
    local r = render(state)
    t.eq({
      '$ make test',
      'Earlier in the output (artifact://3 lines):',
      '12: error[E0308]: mismatched types',
      '13:  --> src/main.rs:2:18',
      '…',
    }, vim.list_slice(r.lines, 1, 5))
    t.eq('artifact://3#L12', card.link_at(r, 2))
    t.eq('artifact://3#L13', card.link_at(r, 3))
    t.eq(nil, card.link_at(r, 4))
    local groups = {}
    for _, h in ipairs(r.highlights) do
      groups[h[1]] = h[4]
    end
    t.eq('AgentBashRescued', groups[2])
    -- Once the full artifact is loaded, the lines are in place: no block.
    state.full_lines = { 'a', 'b' }
    t.eq({ '$ make test', 'a', 'b' }, render(state, true).lines)
  end)

  t.it('the footer shows the receipt of a finished run', function()
    local state = done(tool({ lines = { 'x' } }), {
      resources = { wall_ms = 2100, cpu_user_ms = 1900, cpu_sys_ms = 120, max_rss_kib = 215040 },
    })
    t.eq(' 2.0 s CPU, 210 MiB · y yank · <C-s> split · q close ', render(state).footer[1][1])
    t.eq('1.5 GiB', card.receipt({ resources = { wall_ms = 1, max_rss_kib = 1572864 } }))
    t.eq(nil, card.receipt({ resources = { wall_ms = 1 } }))
    -- Cheap runs say nothing.
    t.eq(nil, card.receipt({ resources = { wall_ms = 5, cpu_user_ms = 3, cpu_sys_ms = 1, max_rss_kib = 2048 } }))
    t.eq(nil, card.receipt({}))
  end)

  t.it('cwd header', function()
    t.eq({ '$ cd src && make test' }, render(tool({ cwd_label = 'src' })).lines)
  end)

  t.it('multi-line command header', function()
    t.eq({ '$ cat <<EOF', '  a', '  EOF' }, render(tool({ command = 'cat <<EOF\na\nEOF' })).lines)
  end)

  t.it('failed to start', function()
    local r = render(tool({ status = 'failed', error = 'Working directory does not exist: /nope' }))
    t.eq({ '$ make test', 'Bash command failed: Working directory does not exist: /nope' }, r.lines)
    t.eq({ { ' ✗ ', 'AgentBashError' }, { '$ make test · failed ', 'AgentBashTitle' } }, r.title)
  end)

  t.it('blocked by an interception rule', function()
    local state = done(tool({ command = 'cat x' }), {
      output = 'Blocked: Use the `read` tool instead of cat/head/tail.\n\nOriginal command: cat x',
      exit_code = nil,
      is_error = true,
      blocked = { blocked = true, rule = 1, suggested_tool = 'read', message = 'Use the `read` tool' },
    })
    t.eq({ '$ cat x', 'Blocked: Use the `read` tool instead of cat/head/tail.', '', 'Original command: cat x' }, render(state).lines)
  end)

  t.it('maps ANSI spans onto wrapped rows', function()
    local state = tool({ lines = { 'abcdefghijKLMNO' }, hl = { { 0, 8, 12, { fg = 1, bold = true } } }, total_lines = 1 })
    local r = card.render(state, { width = 10, expanded = false })
    t.eq({ '$ make tes', 't', 'abcdefghij', 'KLMNO' }, { r.lines[1]:sub(1, 10), r.lines[1]:sub(11), r.lines[2], r.lines[3] })
    t.eq({
      { 0, 0, 11, 'AgentBashHeader' },
      { 1, 8, 10, 'AgentBashAnsi_f1_B' },
      { 2, 0, 2, 'AgentBashAnsi_f1_B' },
    }, r.highlights)
    t.eq({ AgentBashAnsi_f1_B = { fg = 1, bold = true } }, r.styles)
  end)
end)

t.describe('bang card', function()
  t.it('running shows the last 20 logical lines and the cancel hint', function()
    local r = render(bang({ lines = numbered(30), total_lines = 30 }))
    local expected = vim.list_extend({ '$ ls -la' }, numbered(20, 11))
    expected[#expected + 1] = 'Running… (<Esc> to cancel)'
    t.eq(expected, r.lines)
    t.eq({ 21, 0, #'Running… (<Esc> to cancel)', 'AgentBashRunning' }, r.highlights[#r.highlights])
    t.eq({ { ' ● ', 'AgentBashRunning' }, { '$ ls -la · running ', 'AgentBashTitle' } }, r.title)
  end)

  t.it('long lines are not wrapped into rows', function()
    local long = ('x'):rep(100)
    local r = render(bang({ lines = { long }, total_lines = 1 }))
    t.eq({ '$ ls -la', long, 'Running… (<Esc> to cancel)' }, r.lines)
    t.eq(1 + 3 + 1, r.height)
  end)

  t.it('done, collapsed: more lines hint, exit code, truncation warning without brackets', function()
    local state = bang({ lines = numbered(25, 76) })
    done(state, { exit_code = 1, is_error = true, total_lines = 100, output_lines = 25, truncated = true, artifact_id = 3 })
    -- The notes stand above the shown tail, where the hidden lines are: what <Tab> shows (5
    -- retained lines), and apart, what only the artifact holds (75 lines).
    local expected = {
      '$ ls -la',
      '… 5 more lines (<Tab> to expand), 75 earlier lines in artifact://3 (o: full output)',
    }
    vim.list_extend(expected, numbered(20, 81))
    vim.list_extend(expected, {
      '(exit 1)',
      'Full output: artifact://3. Truncated: 25 lines shown (50.0KB limit)',
    })
    t.eq(expected, render(state).lines)
  end)

  t.it('done, expanded: every retained line', function()
    local state = done(bang({ lines = numbered(25) }), { total_lines = 25, output_lines = 25 })
    t.eq(vim.list_extend({ '$ ls -la' }, numbered(25)), render(state, true).lines)
    local collapsed = render(state).lines
    t.eq('… 5 more lines (<Tab> to expand)', collapsed[2])
    t.eq(vim.list_extend({ '$ ls -la', '… 5 more lines (<Tab> to expand)' }, numbered(20, 6)), collapsed)
  end)

  t.it('success prints no status line', function()
    t.eq({ '$ ls -la', 'a' }, render(done(bang({ lines = { 'a' } }), { total_lines = 1 })).lines)
  end)

  t.it('cancelled', function()
    local state = done(bang({ lines = { 'a' } }), { exit_code = nil, cancelled = true, total_lines = 1 })
    t.eq({ '$ ls -la', 'a', '(cancelled)' }, render(state).lines)
  end)

  t.it('failure to start', function()
    local r = render(bang({ status = 'failed', error = 'backend exited' }))
    t.eq({ '$ ls -la', 'Bash command failed: backend exited' }, r.lines)
  end)

  t.it('excluded from context: everything dimmed, no colours', function()
    local state = bang({ exclude = true, lines = { 'red' }, hl = { { 0, 0, 3, { fg = 1 } } }, total_lines = 1 })
    local r = render(state)
    t.eq({ '$ ls -la', 'red', 'Running… (<Esc> to cancel)' }, r.lines)
    t.eq({
      { 0, 0, 8, 'AgentBashDim' },
      { 1, 0, 3, 'AgentBashDim' },
      { 2, 0, #'Running… (<Esc> to cancel)', 'AgentBashDim' },
    }, r.highlights)
    t.eq({ { ' ● ', 'AgentBashDim' }, { '$ ls -la · running · not in context ', 'AgentBashDim' } }, r.title)
  end)

  t.it('kill key follows the configuration', function()
    local r = card.render(bang(), { width = W, expanded = false, kill_key = '<C-c>' })
    t.eq({ '$ ls -la', 'Running… (<C-c> to cancel)' }, r.lines)
    r = card.render(bang(), { width = W, expanded = false, kill_key = false })
    t.eq({ '$ ls -la', 'Running… (:AgentBashCancel to cancel)' }, r.lines)
  end)
end)

t.describe('clamp', function()
  t.it('keeps 4000 characters and counts the rest', function()
    t.eq(('x'):rep(4000) .. '… [500 chars omitted]', card.clamp(('x'):rep(4500)))
    t.eq(('x'):rep(4000), card.clamp(('x'):rep(4000)))
  end)

  t.it('counts characters, not bytes', function()
    t.eq(('é'):rep(4000), card.clamp(('é'):rep(4000)))
    t.eq(('é'):rep(4000) .. '… [100 chars omitted]', card.clamp(('é'):rep(4100)))
  end)

  t.it('leaves a line the backend clamped alone', function()
    local line = ('x'):rep(4000) .. '… [123 chars omitted]'
    t.eq(line, card.clamp(line))
  end)

  t.it('applies to output and header lines', function()
    local r = render(done(tool({ command = ('c'):rep(4100), lines = { ('y'):rep(5000) } }), { total_lines = 1 }), true)
    t.eq({ '$ ' .. ('c'):rep(3998) .. '… [102 chars omitted]', ('y'):rep(4000) .. '… [1000 chars omitted]' }, r.lines)
  end)
end)

t.describe('helpers', function()
  t.it('format_size', function()
    local cases = {
      { 0, '0B' },
      { 1023, '1023B' },
      { 1024, '1.0KB' },
      { 1536, '1.5KB' },
      { 51200, '50.0KB' },
      { 1048575, '1.0MB' },
      { 33554432, '32.0MB' },
      { 1073741824, '1.0GB' },
      { 5905580032, '5.5GB' },
    }
    for _, c in ipairs(cases) do
      t.eq(c[2], card.format_size(c[1]), tostring(c[1]))
    end
  end)

  t.it('cwd_label', function()
    t.eq(nil, card.cwd_label(nil, '/p'))
    t.eq(nil, card.cwd_label('.', '/p'))
    t.eq(nil, card.cwd_label('/p/', '/p'))
    t.eq('src', card.cwd_label('src', '/p'))
    t.eq('src/a', card.cwd_label('./src/a/', '/p'))
    t.eq('src', card.cwd_label('/p/src', '/p'))
    t.eq('/other', card.cwd_label('/other', '/p'))
    t.eq('/pq', card.cwd_label('/pq', '/p'))
    t.eq('../x', card.cwd_label('../x', '/p/q'))
  end)

  t.it('wrap: tabs and wide characters', function()
    t.eq({ { 0, 0 } }, card.wrap('', 10))
    t.eq({ { 0, 10 }, { 10, 12 } }, card.wrap(('a'):rep(12), 10))
    t.eq({ { 0, 4 } }, card.wrap('a\tbc', 10)) -- tab fills to col 8, then b, c: exactly 10
    t.eq({ { 0, 4 }, { 4, 5 } }, card.wrap('a\tbcd', 10))
    t.eq({ { 0, 12 }, { 12, 15 } }, card.wrap(('界'):rep(5), 8)) -- 2 cells each
    t.eq(2, card.rows(('界'):rep(5), 8))
  end)

  t.it('status_of', function()
    t.eq('done', card.status_of(result()))
    t.eq('error', card.status_of(result({ exit_code = 3, is_error = true })))
    t.eq('cancelled', card.status_of(result({ exit_code = nil, cancelled = true })))
    t.eq('timed_out', card.status_of(result({ exit_code = nil, cancelled = true, timed_out = true })))
  end)
end)

t.describe('remote card (contract §12)', function()
  t.it('shows the profile while running, then the host the result names', function()
    local s = tool({ profile = 'dev' })
    t.eq({ 'dev:$ make test' }, render(s).lines)
    t.eq('dev:$ make test · running ', render(s).title[2][1])
    done(s, { remote = { profile = 'dev', host = 'devbox' } })
    t.eq('devbox:$ make test', render(s).lines[1])
    t.eq(nil, card.host(tool({ profile = 'local' })))
    t.eq(nil, card.host(tool()))
  end)

  t.it('indents the continuation lines of a multi-line command under the prompt', function()
    local r = render(bang({ command = 'echo a\necho b', profile = 'box' }))
    t.eq({ 'box:$ echo a', '      echo b' }, { r.lines[1], r.lines[2] })
  end)
end)

t.describe('changed files (contract §13)', function()
  local function changed(n)
    local list = {}
    for i = 1, n do
      list[i] = { path = ('f%d.txt'):format(i), kind = i == 2 and 'deleted' or i == 3 and 'mode' or 'added' }
    end
    return list
  end

  t.it('a finished card lists them under the commands that show and undo them', function()
    local s = tool({ status = 'done', lines = { 'ok' }, total_lines = 1, result = result({ changes = changed(2), changes_count = 2, changes_id = 7 }) })
    local r = render(s)
    t.eq({ '$ make test', 'ok', 'Changed files (:AgentBashDiff 7, :AgentBashUndo 7):', '  A f1.txt', '  D f2.txt' }, r.lines)
  end)

  t.it('collapsed shows five and counts the rest; expanded shows every one it has', function()
    local s = bang({ status = 'done', lines = {}, total_lines = 0, result = result({ changes = changed(8), changes_count = 250, changes_id = 3 }) })
    local r = render(s)
    t.eq('  X f3.txt', r.lines[5])
    t.eq('  A f5.txt', r.lines[7])
    t.eq('  … and 245 more', r.lines[8])
    t.eq(true, r.expandable)
    local e = render(s, true)
    t.eq('  A f8.txt', e.lines[#e.lines - 1])
    t.eq('  … and 242 more', e.lines[#e.lines])
  end)

  t.it('a mirrored MCP call names no id of this editor; nothing while running or without changes', function()
    local s = tool({ status = 'done', client = 'agent', result = result({ changes = changed(1), changes_count = 1, changes_id = 4 }) })
    t.eq('Changed files:', render(s).lines[3])
    local none = render(tool({ status = 'done', result = result({ changes_count = 0 }) }))
    t.eq(false, vim.tbl_contains(none.lines, 'Changed files:'))
    local running = render(tool({ result = result({ changes = changed(1) }) }))
    t.eq(1, #running.lines)
  end)

  t.it('a run whose first snapshot was being taken says how far it got, then that receipts are ready', function()
    local why = 'the first snapshot of /p is still being taken: 1 000 of 3 000 files hashed'
    local s = tool({ status = 'done', lines = { 'ok' }, total_lines = 1, result = result({ changes_unavailable = why, changes_indexing = '/p' }) })
    t.eq({ '$ make test', 'ok', 'No receipt: ' .. why }, render(s).lines)
    s.receipts = { root = '/p', state = 'indexing', hashed = 2000, total = 3000, note = 'the first snapshot is being taken: 2 000 of 3 000 files hashed' }
    t.eq('No receipt: the first snapshot is being taken: 2 000 of 3 000 files hashed', render(s).lines[3])
    s.receipts = { root = '/p', state = 'ready', files = 3000, note = 'ready (3 000 files)' }
    t.eq('No receipt for this run; receipts are ready (3 000 files) and start with the next run', render(s).lines[3])
    s.receipts = { root = '/p', state = 'off', reason = 'r', note = 'off: r' }
    t.eq('No receipt; receipts are off: r', render(s).lines[3])
    -- Another reason (no `changes_indexing`): no note; nor while the run goes on.
    t.eq(2, #render(tool({ status = 'done', lines = { 'ok' }, total_lines = 1, result = result({ changes_unavailable = 'x' }) })).lines)
    t.eq(1, #render(tool({ result = result({ changes_indexing = '/p' }) })).lines)
  end)
end)

t.describe('term_chrome', function()
  local function footer(state, focused)
    local _, f = card.term_chrome(state, { width = 100, focused = focused })
    return table.concat(vim.tbl_map(function(c)
      return c[1]
    end, f))
  end

  t.it('a waiting terminal says how to answer from where the cursor is', function()
    local s = bang({ waiting_input = true })
    t.ok(footer(s, true):find('waiting for input: type your answer', 1, true), footer(s, true))
    t.ok(footer(s, false):find('waiting for input: :AgentBashFocus to answer', 1, true), footer(s, false))
    t.eq(nil, footer(bang(), true):find('waiting', 1, true))
  end)

  t.it('a narrow float drops whole keys before the waiting message, and fits', function()
    local s = bang({ waiting_input = true })
    for _, width in ipairs({ 40, 60, 70, 100 }) do
      local _, f = card.term_chrome(s, { width = width, focused = false })
      local text = f[1][1]
      t.ok(vim.fn.strwidth(text) <= width - 2, width .. ': ' .. text)
      t.ok(text:find('waiting for input: :AgentBashFocus', 1, true), width .. ': ' .. text)
      -- Only whole parts: every part shown is one the wide footer has.
      local wide = footer(s, false)
      for part in text:gmatch('[^·]+') do
        t.ok(wide:find(vim.trim(part), 1, true), width .. ': ' .. part)
      end
    end
    local _, f = card.term_chrome(s, { width = 20, focused = false })
    t.ok(vim.fn.strwidth(f[1][1]) <= 18 and f[1][1]:find('^ waiting'), f[1][1])
  end)
end)
