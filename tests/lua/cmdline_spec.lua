-- cmdline.lua (`:AgentBash` expands like `:!`) and quickfix.lua's choice of format.
local t = ...

local cmdline = require('agent_bash.cmdline')
local quickfix = require('agent_bash.quickfix')

local dir = vim.fn.tempname()
vim.fn.mkdir(dir, 'p')
vim.cmd.cd(dir)
vim.fn.writefile({ 'alpha beta' }, dir .. '/first.txt')
vim.fn.writefile({ 'x' }, dir .. '/second.c')
vim.cmd('edit second.c')
vim.cmd('edit first.txt')

t.describe('expand', function()
  for _, case in ipairs({
    { 'wc -l %', 'wc -l first.txt' },
    { 'wc -l % #', 'wc -l first.txt second.c' },
    { "cat '%:p:h'/x", "cat '" .. dir .. "'/x" },
    { 'echo %:t:r', 'echo first' },
    { 'echo <cword> <cWORD>', 'echo alpha alpha' },
    { 'x=% y', 'x=first.txt y' },
    { "printf 'a\\nb\\n'", "printf 'a\\nb\\n'" },
    { "printf '%s\\n' 50%", "printf '%s\\n' 50%" },
    { 'echo ${f%.c} $# "$@"', 'echo ${f%.c} $# "$@"' },
    { 'date +%Y-%m', 'date +%Y-%m' },
    { 'echo \\% \\# \\<cword>', 'echo % # <cword>' },
    { 'grep -n x %|wc -l', 'grep -n x first.txt|wc -l' },
    { 'a\\\\b', 'a\\\\b' },
  }) do
    t.it(case[1], function()
      t.eq(case[2], (cmdline.expand(case[1])))
    end)
  end

  t.it('a % with no file name is an error', function()
    vim.cmd('enew')
    local cmd, err = cmdline.expand('wc -l %')
    t.eq(nil, cmd)
    t.eq("no file name to substitute for '%' (the buffer has no name)", err)
    vim.cmd('buffer first.txt')
  end)

  t.it('remembers the last command', function()
    t.eq('no previous command to run again (:AgentBash {cmd} runs one)', select(2, cmdline.last()))
    cmdline.remember('make test')
    t.eq('make test', (cmdline.last()))
  end)
end)

t.describe('quickfix', function()
  t.it('finds the program behind assignments and wrappers', function()
    t.eq('cargo', quickfix.program('RUST_LOG=1 cargo build'))
    t.eq('gcc', quickfix.program('/usr/bin/gcc -c x.c'))
    t.eq('pytest', quickfix.program('python3 -m pytest -x'))
    t.eq('tsc', quickfix.program('npx tsc --noEmit'))
    t.eq('eslint', quickfix.program('env -i pnpm exec eslint .'))
    t.eq('go', quickfix.program('time go test ./... | tee log'))
  end)

  t.it("uses the compiler's format, else the window's 'errorformat'", function()
    local cargo = quickfix.errorformat('cargo build')
    t.ok(cargo:find('%-G', 1, true) or cargo:find('%E', 1, true), cargo)
    t.ok(cargo ~= vim.o.errorformat)
    vim.bo.errorformat = 'XX%f@%l:%m'
    t.eq('XX%f@%l:%m', quickfix.errorformat('printf x', vim.api.nvim_get_current_win()))
    vim.bo.errorformat = ''
    t.eq(vim.o.errorformat, quickfix.errorformat('printf x', vim.api.nvim_get_current_win()))
  end)
end)
